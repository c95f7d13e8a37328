"""The read-only trajectory viewer: its routes, the data it shows and its static files (`static/`).
It reads through the trajectory store and never changes data."""
