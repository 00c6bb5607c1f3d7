# Library (prepended to a program, never run alone): the host's records of
# containers, keyed by full container ID, in the login user's state directory.
#
#   provisioned/ID  the sha256 of the setup script that provisioned ID, written
#                   when it succeeded: an attach learns "provisioned" without a
#                   `docker exec`.
#   adopted/ID      the cluster that took ID over (`up` with adopt): docker
#                   cannot relabel a running container.
#
# A new container is a new ID, so a record never vouches for a container it was
# not written for. Callers pass only checked values: an ID is 64 hex digits.

# cvs_records_dir: prints nothing; sets cvs_records to the state directory.
cvs_records_dir() {
  cvs_records=${XDG_STATE_HOME:-$HOME/.local/state}/cvs
}

# cvs_is_id WORD: WORD is a full container ID.
cvs_is_id() {
  case $1 in *[!0-9a-f]*) return 1 ;; esac
  [ ${#1} -eq 64 ]
}

# cvs_record_write KIND ID VALUE: write one record (0600 in a 0700 directory,
# atomically). Records not rewritten for 60 days are pruned on a provisioning
# write: they belong to containers removed behind cvs's back (a probe falls
# back to the in-container marker and writes the record again).
cvs_record_write() {
  cvs_is_id "$2" || return 1
  cvs_records_dir
  (
    umask 077
    mkdir -p "$cvs_records/$1" &&
      printf '%s\n' "$3" >"$cvs_records/$1/$2.tmp" &&
      mv -f "$cvs_records/$1/$2.tmp" "$cvs_records/$1/$2"
  ) 2>/dev/null || return 1
  if [ "$1" = provisioned ]; then
    find "$cvs_records/provisioned" -type f -mtime +60 -exec rm -f {} + 2>/dev/null
  fi
  return 0
}

# cvs_records_forget ID…: drop every record of these containers (words that
# are not full IDs are skipped).
cvs_records_forget() {
  cvs_records_dir
  for _cvs_id in "$@"; do
    cvs_is_id "$_cvs_id" || continue
    rm -f "$cvs_records/provisioned/$_cvs_id" "$cvs_records/adopted/$_cvs_id"
  done
  return 0
}

# cvs_records_read ID: print the record frames about ID (`@@cvs:adopted ID
# CLUSTER`, `@@cvs:record ID SHA256`); succeed when a provisioning record was
# found. Builtins only (the probe's attach path).
cvs_records_read() {
  cvs_records_dir
  _cvs_rec=
  if [ -r "$cvs_records/adopted/$1" ] && IFS= read -r _cvs_who <"$cvs_records/adopted/$1"; then
    [ -n "$_cvs_who" ] && printf '@@cvs:adopted %s %s\n' "$1" "$_cvs_who"
  fi
  if [ -r "$cvs_records/provisioned/$1" ]; then
    read -r _cvs_rec _ <"$cvs_records/provisioned/$1"
    cvs_is_id "$_cvs_rec" || _cvs_rec=
    [ -n "$_cvs_rec" ] && printf '@@cvs:record %s %s\n' "$1" "$_cvs_rec"
  fi
  [ -n "$_cvs_rec" ]
}
