"""Reading and writing files: the one input gate, fixtures, arrays, bundled examples, trace writers."""
