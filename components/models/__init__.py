"""Model folders: loading, saving and finding them (modelio), batched generation on a model in
memory (batching), and base models from GGUF files."""
