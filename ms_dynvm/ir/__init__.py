"""SSA IR: one Function per basic block, the op registry (shape/dtype rules) and the verifier."""
