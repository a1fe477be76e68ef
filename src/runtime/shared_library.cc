// libgyre.so (the installed library, docs/embedding.md) has no code of its own: it is the
// modules' static archives linked whole (src/runtime/CMakeLists.txt). This translation unit only
// gives the shared target a source.
