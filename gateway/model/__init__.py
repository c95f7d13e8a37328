"""The model's side of a turn: its profile (tokenizer, template, formats), chat-template rendering,
incremental tokenization and the start-up template probe. It knows no sessions, engine or HTTP."""
