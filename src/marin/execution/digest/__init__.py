"""The digest layer: code and output digests; config and code drift explanations."""
