"""The CLI commands (one module per command group) and what they share: flags to specs, flag checks, progress, what a priced run reports."""
