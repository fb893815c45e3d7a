//! The `static inline` verbs of `<infiniband/verbs.h>`, ported. (Being written.)
