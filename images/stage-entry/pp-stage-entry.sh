#!/bin/sh
# pp-stage-entry: the hand-off of a pp-launch chain inside Docker Compose. POSIX sh only, so it wraps any
# image that has /bin/sh.
#
# Runs the worker ("$@") with its output passed on unchanged, and writes this stage's first valid
# announcement (PP_GPU_NODE_ADDR <node_id> <direct>) to $PP_ANNOUNCE_DIR/stage-$STAGE.addr; the stage's
# healthcheck waits for that file. Every service starts at once: stage k >= 1 first waits for the files of
# stage k-1 and stage 0 (up to PP_ADDR_TIMEOUT seconds) and exports PEER_* and FIRST_PEER_* from them,
# validated again. A malformed
# announcement is never written: the stage stays unhealthy and says why on stderr.
set -u
dir=${PP_ANNOUNCE_DIR:-/pp-announce}
stage=${STAGE:?pp-stage-entry: STAGE is not set}
mine="$dir/stage-$stage.addr"
cr=$(printf '\r')

say() { printf 'pp-stage-entry[%s]: %s\n' "$stage" "$*" >&2; }
visible() { printf '%s' "$1" | tr -c '[:print:]' '?'; }

# --- grammar begin (docs/formats.md; tests run this block against pp_launch.announce)
valid_id() {
    [ ${#1} -eq 64 ] || return 1
    case $1 in *[!0-9a-f]*) return 1 ;; esac
}

valid_ipv4() {  # four decimal octets 0-255, no leading zeros
    case $1 in '' | .* | *. | *..* | *[!0-9.]*) return 1 ;; esac
    old_ifs=$IFS
    IFS=.
    # shellcheck disable=SC2086
    set -- $1
    IFS=$old_ifs
    [ $# -eq 4 ] || return 1
    for octet; do
        case $octet in 0?*) return 1 ;; esac
        [ ${#octet} -le 3 ] && [ "$octet" -le 255 ] || return 1
    done
}

hex_groups() {  # "g:g:g" -> count; each group 1-4 hex digits; empty is zero groups
    count=0
    g=$1
    [ -n "$g" ] || return 0
    case $g in :* | *:) return 1 ;; esac
    while :; do
        h=${g%%:*}
        case $h in '' | *[!0-9A-Fa-f]*) return 1 ;; esac
        [ ${#h} -le 4 ] || return 1
        count=$((count + 1))
        case $g in *:*) g=${g#*:} ;; *) break ;; esac
    done
}

valid_ipv6() {  # as Python's ipaddress, without scope ids
    a=$1
    n=8
    case $a in '' | *:::* | *::*::* | *[!0-9A-Fa-f:.]*) return 1 ;; esac
    case $a in
        *.*)
            valid_ipv4 "${a##*:}" || return 1
            case $a in *:*) ;; *) return 1 ;; esac
            a=${a%:*}
            case $a in *:) a=${a}: ;; esac
            n=6
            ;;
    esac
    case $a in
        *::*)
            hex_groups "${a%%::*}" || return 1
            left=$count
            hex_groups "${a#*::}" || return 1
            [ $((left + count)) -lt "$n" ] || return 1
            ;;
        *)
            hex_groups "$a" || return 1
            [ "$count" -eq "$n" ] || return 1
            ;;
    esac
}

valid_dns() {  # labels of 1-63 letters, digits and '-', not starting or ending with '-'; trailing dots ignored
    d=$1
    while :; do case $d in *.) d=${d%.} ;; *) break ;; esac; done
    [ -n "$d" ] && [ ${#d} -le 253 ] || return 1
    case $d in *[!A-Za-z0-9.-]*) return 1 ;; esac
    rest_d=$d
    while :; do
        label=${rest_d%%.*}
        [ -n "$label" ] && [ ${#label} -le 63 ] || return 1
        case $label in -* | *-) return 1 ;; esac
        case $rest_d in *.*) rest_d=${rest_d#*.} ;; *) break ;; esac
    done
}

valid_direct() {  # host:port[,host:port...]; host an IPv4 address, [IPv6] or DNS name; port 1-65535
    case $1 in '' | ,* | *, | *,,*) return 1 ;; esac
    rest=$1
    while [ -n "$rest" ]; do
        item=${rest%%,*}
        case $rest in *,*) rest=${rest#*,} ;; *) rest= ;; esac
        port=${item##*:}
        host=${item%:*}
        [ -n "$host" ] && [ "$host" != "$item" ] || return 1
        case $port in '' | *[!0-9]*) return 1 ;; esac
        [ ${#port} -le 5 ] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || return 1
        case $host in
            \[*\]) host=${host#?} && valid_ipv6 "${host%?}" || return 1 ;;
            *[!0-9.]*) valid_dns "$host" || return 1 ;;
            *) valid_ipv4 "$host" || return 1 ;;
        esac
    done
}

parse_announcement() {  # LINE -> 0 valid (sets id, direct), 1 malformed, 2 not an announcement
    t=${1#"${1%%[! 	"$cr"]*}"}
    t=${t%"${t##*[! 	"$cr"]}"}
    case $t in PP_GPU_NODE_ADDR*) ;; *) return 2 ;; esac
    rest=${t#PP_GPU_NODE_ADDR }
    id=${rest%% *}
    direct=${rest#* }
    [ "$rest" != "$t" ] && [ "$direct" != "$rest" ] && valid_id "$id" && valid_direct "$direct" || return 1
}
# --- grammar end

read_announcement() {  # FILE -> ann_id, ann_direct; waits for the file up to PP_ADDR_TIMEOUT seconds
    waited=0
    limit=$(( ${PP_ADDR_TIMEOUT:-60} * 10 ))
    while [ ! -s "$1" ]; do
        if [ "$waited" -ge "$limit" ]; then
            say "no announcement in $1 after ${PP_ADDR_TIMEOUT:-60} s: the earlier stage is not up"
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    read -r ann_id ann_direct < "$1"
    if ! valid_id "$ann_id" || ! valid_direct "$ann_direct"; then
        say "the announcement in $1 is invalid; not passing it on"
        exit 1
    fi
}

filter() {  # the worker's stdout: every line passed on; the first announcement checked and recorded
    state=waiting
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line"
        [ "$state" = waiting ] || continue
        parse_announcement "$line"
        case $? in
            0)
                printf '%s %s\n' "$id" "$direct" > "$mine.tmp" && mv "$mine.tmp" "$mine"
                say "announced $direct"
                state=announced
                ;;
            1)
                say "malformed announcement, not passed on (stage stays unhealthy): $(visible "$t")"
                state=malformed
                ;;
        esac
    done
}

mkdir -p "$dir"
rm -f "$mine" "$mine.tmp"
if [ "$stage" -gt 0 ]; then
    read_announcement "$dir/stage-$((stage - 1)).addr"
    PEER_NODE_ID=$ann_id PEER_DIRECT=$ann_direct
    read_announcement "$dir/stage-0.addr"
    FIRST_PEER_NODE_ID=$ann_id FIRST_PEER_DIRECT=$ann_direct
    export PEER_NODE_ID PEER_DIRECT FIRST_PEER_NODE_ID FIRST_PEER_DIRECT
fi
if [ $# -eq 0 ]; then
    say "no worker command given"
    exit 2
fi

fifo=$(mktemp -u "${TMPDIR:-/tmp}/pp-stage-entry.XXXXXX")
mkfifo "$fifo" || exit 1
trap 'rm -f "$fifo" "$mine" "$mine.tmp"' EXIT
exec 3<&0
"$@" <&3 >"$fifo" &
worker=$!
filter <"$fifo" &
reader=$!
trap 'kill -TERM "$worker" 2>/dev/null' TERM INT HUP
while :; do  # a trapped signal interrupts wait: wait again until the worker is really gone
    wait "$worker"
    status=$?
    kill -0 "$worker" 2>/dev/null || break
done
wait "$reader"
exit "$status"
