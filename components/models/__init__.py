"""Model folders: loading, saving and finding them (modelio), and base models from GGUF files."""
