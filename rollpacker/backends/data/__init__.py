"""Training data: `tasks` (reasoning-gym problems and scoring), `files` (--dataset JSONL / Parquet),
`rows` (prompt rows rendered with the chat template)."""
