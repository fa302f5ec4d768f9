"""Model mode: a GPT-style decoder trained with each loss back-end (issue 7)."""
