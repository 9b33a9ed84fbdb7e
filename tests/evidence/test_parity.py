from orchestrator.evidence.parity import compare

KW = dict(steps=5, loss_rtol=2e-3, grad_norm_rtol=2e-2)


def test_within_tolerance_passes():
    ref = [3.0, 2.9, 2.8, 2.7, 2.6]
    p = compare([x * (1 + 1e-4) for x in ref], ref, [1.0] * 5, [1.01] * 5, **KW)
    assert p.passed and p.steps == 5 and p.max_loss_diff < 2e-3


def test_divergence_fails_and_names_the_step():
    ref = [3.0, 2.9, 2.8, 2.7, 2.6]
    cand = ref[:3] + [2.9, 2.95]
    p = compare(cand, ref, [1.0] * 5, [1.0] * 5, **KW)
    assert not p.passed and "step 5" in p.detail and p.max_loss_diff > 0.1


def test_grad_norm_divergence_fails():
    ref = [3.0] * 5
    p = compare(ref, ref, [1.0] * 5, [1.5] * 5, **KW)
    assert not p.passed and "grad norm" in p.detail


def test_too_few_steps_is_no_verdict():
    p = compare([3.0, 2.9], [3.0, 2.9, 2.8, 2.7, 2.6], [], [], **KW)
    assert not p.passed and "only 2 of 5" in p.detail
