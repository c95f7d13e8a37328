"""Operations routes: `/healthz`, `/readyz` and `/metrics`."""
