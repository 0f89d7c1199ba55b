"""Problems: where GSM8K-style problems come from (sources, the synthetic generator), their format and answer
checking."""
