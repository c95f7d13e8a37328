"""The engine client: SGLang's `/generate` and friends (`backend.py`) and vLLM's tokens-in
`/inference/v1/generate` (`vllm_backend.py`) over one transport seam (`transport.py`;
`http1_transport.py` for `http://`, aiohttp for `https://`). It knows ids and bytes, not templates,
sessions or the ledger."""
