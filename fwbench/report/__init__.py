"""Reports read the store only: terminal tables, JSON and CSV. No framework imports, no re-running."""
