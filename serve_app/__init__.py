"""Self-hostable inference platform: a Ray Serve gateway for chat, embeddings, images,
video and audio."""
