"""What every API surface's turn shares: the serving flow each API fills in, the turn routes and the
session they name, and the edge middleware that serves them. It knows no surface's shapes."""
