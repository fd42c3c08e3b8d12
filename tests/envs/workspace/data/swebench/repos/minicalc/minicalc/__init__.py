"""minicalc: small arithmetic helpers."""
