"""Code that runs inside people's notebook servers (jupyterhub-singleuser), not in the hub."""
