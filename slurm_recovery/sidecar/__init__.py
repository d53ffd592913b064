"""The per-node sidecar: GPU, kernel-log and fabric signals, hook events, reliable delivery."""
