"""RunPod provisioning for the labs (host side, standard library only).

api: the GraphQL client; local: the key and the state file; provision: pods up and down;
ssh: the ssh/rsync command lines; remote: sync, run, logs, fetch over SSH. The scripts that
run on a pod are in the repository's runpod/ folder.
"""
