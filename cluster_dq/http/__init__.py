"""HTTP: the lmstfy-compatible data API (app.py) and the admin API (admin.py)."""
