"""Research loops: variants of editable files, each run on its own GPU, kept when better."""
