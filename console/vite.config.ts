import { defineConfig } from "vite";

// Served by the gateway at /console/ (same origin as /api/v1). `npm run dev` proxies the API
// to a gateway on port 8000 (the default of serve_app/settings.py).
export default defineConfig({
  base: "/console/",
  build: { outDir: "dist", emptyOutDir: true },
  server: {
    proxy: { "/api": { target: "http://127.0.0.1:8000", changeOrigin: false } },
  },
});
