"""The API surfaces, one folder each (Chat Completions, Completions, Anthropic Messages, OpenAI
Responses): each validates its wire format and translates it into one internal turn and back."""
