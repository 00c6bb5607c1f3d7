# The host records (lib records.sh, prepended), as a command:
#   record.sh provisioned ID SHA256   after a setup script succeeded
#   record.sh adopted ID CLUSTER      after `up` adopted ID (says so on stdout)
#   record.sh forget ID…              after cvs removed these containers
# A provisioning record that cannot be written only costs the next probe a
# `docker exec`: that one never fails the command it follows.
kind=$1
shift
case $kind in
  provisioned)
    cvs_record_write provisioned "$1" "$2"
    exit 0 ;;
  adopted)
    cvs_record_write adopted "$1" "$2" || {
      echo "cvs: could not write the adoption record of $1" >&2
      exit 1
    }
    echo "adopted $(printf %.12s "$1")" ;;
  forget)
    cvs_records_forget "$@" ;;
  *)
    echo "cvs: unknown record kind $kind" >&2
    exit 2 ;;
esac
