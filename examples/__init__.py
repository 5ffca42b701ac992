"""Scripts using tfcomp (run them from the repository root; see each module's docstring)."""
