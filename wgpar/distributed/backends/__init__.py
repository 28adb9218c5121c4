"""Implementations of the ProcessGroup interface (``threads``: ranks are threads of one process)."""
