# shellcheck shell=bash
# Shared functions of the rtgt Linux initiator lab (sourced by build-image.sh and run.sh).
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file

LAB_DIR=${LAB_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
LAB_CACHE=${RTGT_LAB_CACHE:-${HOME:-/root}/.cache/rtgt-lab}
LAB_SUITE=${RTGT_LAB_SUITE:-bookworm}

lab_log() { printf '%s lab: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
lab_die() { lab_log "error: $*"; exit 1; }

# Print the Debian mirror entries configured on this machine for $LAB_SUITE (and its -updates and
# -security suites) as one-line sources.list entries. Reads /etc/apt/sources.list, *.list and
# deb822 *.sources. RTGT_LAB_MIRROR (a URL) overrides the main archive.
lab_debian_sources() {
    local files=() f
    [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
    for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] && files+=("$f")
    done
    local entries
    entries=$(
        for f in "${files[@]}"; do
            case $f in
            *.sources)
                # deb822: paragraphs of "Field: value"; emit "uri|suite|signed-by" per suite.
                awk '
                    function flush() {
                        if (types ~ /(^| )deb( |$)/ && enabled != "no") {
                            n = split(uris, u, " "); m = split(suites, s, " ")
                            for (i = 1; i <= n; i++) for (j = 1; j <= m; j++)
                                print u[i] "|" s[j] "|" signed
                        }
                        types = uris = suites = signed = enabled = ""
                    }
                    /^[ \t]*#/ { next }
                    /^[ \t]*$/ { flush(); next }
                    {
                        key = tolower($1); sub(/:$/, "", key); val = $0; sub(/^[^:]*:[ \t]*/, "", val)
                        if (key == "types") types = val
                        else if (key == "uris") uris = val
                        else if (key == "suites") suites = val
                        else if (key == "signed-by") signed = val
                        else if (key == "enabled") enabled = tolower(val)
                    }
                    END { flush() }' "$f"
                ;;
            *)
                # one-line format: deb [options] uri suite components...
                awk '
                    $1 != "deb" { next }
                    {
                        signed = ""; i = 2
                        if ($2 ~ /^\[/) {
                            while (i <= NF) {
                                if ($i ~ /signed-by=/) { signed = $i; sub(/.*signed-by=/, "", signed); sub(/\]$/, "", signed) }
                                if ($i ~ /\]$/) { i++; break }
                                i++
                            }
                        }
                        print $i "|" $(i + 1) "|" signed
                    }' "$f"
                ;;
            esac
        done
    )
    local suite uri signed opt line out=""
    for suite in "$LAB_SUITE" "$LAB_SUITE-updates" "$LAB_SUITE-security"; do
        line=$(printf '%s\n' "$entries" | awk -F'|' -v s="$suite" '$2 == s { print; exit }')
        if [[ -z $line ]]; then
            [[ $suite == "$LAB_SUITE" && -z ${RTGT_LAB_MIRROR:-} ]] &&
                lab_die "no Debian mirror for suite $suite in /etc/apt/sources.list* (set RTGT_LAB_MIRROR=URL)"
            [[ $suite == "$LAB_SUITE" ]] && line="$RTGT_LAB_MIRROR|$suite|"
            [[ -z $line ]] && continue
        fi
        IFS='|' read -r uri _ signed <<<"$line"
        [[ $suite == "$LAB_SUITE" && -n ${RTGT_LAB_MIRROR:-} ]] && uri=$RTGT_LAB_MIRROR
        opt=""
        # Only file paths can be passed as signed-by in the one-line format.
        [[ -n $signed && $signed == /* && -f $signed ]] && opt="[signed-by=$signed] "
        out+="deb ${opt}${uri} ${suite} main"$'\n'
    done
    printf '%s' "$out"
}
