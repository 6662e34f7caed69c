"""Image endpoints: the inputs they share (decoding, checks, uploads)."""
