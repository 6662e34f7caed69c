"""Ray Serve model deployments, one class per engine family (text, embedding, image, audio,
video), bound by name for the catalog models each serves: deployments/registry.py.

- `spec`: what a deployment is told about its models (no import from serve_app).
- `base`: what every model deployment shares (engines by model id, "not served here").
- `engines/`: the engines, one module per modality; `weights/`: where their weights come from.
- `catalog_file`: a catalog file read into plain data, for the Gateway and the weights builder.
- configs/deployments.yaml: the deployments' Serve options.
"""
