"""The framework hint adapter: put on PYTHONPATH by the launcher (sitecustomize.py)."""
