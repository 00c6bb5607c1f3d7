# Inside the container (lib listen.sh prepended), when the probe cannot learn
# it from the host: does sshd listen, and the provisioning marker.
#   check.sh PORT_HEX MARKER [NETDIR]
# (NETDIR: the socket tables, /proc/net unless a test says otherwise.)
# Prints `listen yes|no|unknown`, then `marker present` and the marker's
# content, or `marker absent`.
port_hex=$1 marker=$2
cvs_listening "${3:-/proc/net}" "$port_hex"
case $? in
  0) echo "listen yes" ;;
  1) echo "listen no" ;;
  *) echo "listen unknown" ;;
esac
if [ -r "$marker" ]; then
  echo marker present
  cat "$marker"
else
  echo marker absent
fi
