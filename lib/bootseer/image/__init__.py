"""Container images: squashfs files, served lazily with hot-block prefetch."""
