"""nri-gpu's command line and host set-up: ``nri-gpu run|info|plan|config|install|
uninstall|node-setup|cdi`` (``__main__``), the runtime's and Docker's config edits,
the systemd units, the CDI spec and the checks of its hook. Imports the NRI
adapter (``nri_gpu.plugin``) and the engine's front door; neither imports this."""
