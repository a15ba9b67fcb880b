"""RunPod provisioning for the labs (host side, standard library only).

api: the REST v2 client; local: the key and the state file; provision: pods and Instant
Clusters up and down; watchdog: what ends each pod at --max-hours (it runs on the pod);
ssh: the ssh/rsync command lines; remote: sync, run, logs, fetch over SSH. The scripts that
run on a pod are in the repository's runpod/ folder.
"""
