"""The Gemini API surface (`generateContent`, `streamGenerateContent`)."""
