"""OpenAI Completions (`/v1/completions`): raw prompts, text or token ids."""
