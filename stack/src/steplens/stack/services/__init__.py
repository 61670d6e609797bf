"""One module per service of the local stack; each implements :class:`Service`."""
