"""The chat types of the model port and the chat-completions wire format, streamed or not (pure)."""
