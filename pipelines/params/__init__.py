"""Flow-only params code: the `-S` writer and remote allow-list, the params facade and description for code outside
the stages."""
