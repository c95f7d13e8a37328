"""Output parsing: the model's text into reasoning, content and tool calls (one registry of tool-call
formats), and incremental detokenization. It knows no templates, sessions or HTTP."""
