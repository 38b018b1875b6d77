"""The dashboard: static ES modules served at /ui, with a Content-Security-Policy that allows no inline script."""
