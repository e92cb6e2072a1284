// Declarations only: see gloo-decl/README.md.
