"""The engine client: SGLang's `/generate` and friends (`backend.py`) over one transport seam
(`transport.py`; `http1_transport.py` for `http://`, aiohttp for `https://`). It knows ids and bytes,
not templates, sessions or the ledger."""
