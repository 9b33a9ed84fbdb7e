"""The sweep report: reads the ledger, draws with matplotlib, writes one self-contained HTML page."""
