"""The store's error: :class:`StoreError`, a database that cannot be used (one line for the user)."""


class StoreError(Exception):
    """A database that cannot be used; the message is one line for the user."""
