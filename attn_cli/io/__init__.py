"""Files in and out: the one input gate, fixtures, arrays, examples, trace writers."""
