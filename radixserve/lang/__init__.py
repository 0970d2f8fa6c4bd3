"""The frontend language: SGLang's `gen` / `select` / `fork` programs, run in process."""
