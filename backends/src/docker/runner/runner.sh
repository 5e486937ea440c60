# The runner: POSIX sh, kept in a file beside its request pipe (so that it
# is on no command line), and started as `sh -c BOOT hermes-runner THIS PART
# DIR ...` where BOOT is `# hermes-runner<newline>. "$1"` and THIS is the
# file's path. PART is one of:
#   start DIR PIPE                  checks, starts `serve`, prints `ok` or why not
#   serve DIR PIPE SETSID DROP      reads request names from PIPE, one a line
#   handle DIR NAME SETSID DROP     runs the request in DIR/NAME
# Each `serve` and `handle` is started through `setsid setsid`: in a session
# of its own, and with the default signal dispositions (a child of `&` in a
# non-interactive shell would ignore SIGINT and SIGQUIT, and pass that on).
# Every variable here is named hermes_*: `handle` unsets them before it
# loads the command's environment, so none reaches the command.
# `hermes_reap MARKER` (put before this script by hermes: the kill script
# of crate::exec) kills the processes carrying MARKER and their descendants.
hermes_boot='# hermes-runner
. "$1"'
case $2 in
start)
	hermes_s=$(command -v setsid 2>/dev/null)
	case $hermes_s in
	/*) ;;
	*)
		echo 'unsupported: no setsid in the image'
		exit 0
		;;
	esac
	[ -p "$3/$4" ] || {
		echo "unsupported: $3/$4 is not the request pipe"
		exit 0
	}
	# What a shell adds to its children's environment (PWD, ...), to be
	# dropped again unless the container's own environment has it.
	hermes_env=$(tr '\0' '\n' <"/proc/$$/environ" 2>/dev/null)
	hermes_drop=
	for hermes_v in PWD OLDPWD SHLVL _; do
		case "
$hermes_env" in
		*"
$hermes_v="*) ;;
		*) hermes_drop="$hermes_drop $hermes_v" ;;
		esac
	done
	"$hermes_s" -- "$hermes_s" -- sh -c "$hermes_boot" hermes-runner "$1" serve "$3" "$4" "$hermes_s" "$hermes_drop" </dev/null >/dev/null 2>&1
	echo ok
	;;
serve)
	# Opened read-write: never at end of file, and a reader is there for
	# as long as this runs (hermes opens the pipe without blocking: no
	# reader means no runner).
	exec 3<>"$3/$4"
	while IFS= read -r hermes_n <&3; do
		case $hermes_n in
		q) exit 0 ;;
		x.*[!0-9a-z.]* | x.) ;;
		x.*) "$5" -- "$5" -- sh -c "$hermes_boot" hermes-runner "$1" handle "$3" "$hermes_n" "$5" "$6" </dev/null >/dev/null 2>&1 3<&- ;;
		esac
	done
	;;
handle)
	hermes_x=$3/$4
	hermes_s=$5
	hermes_drop=$6
	# The claim: whoever creates it first, this or hermes withdrawing the
	# request, has the request.
	set -C
	{ : >"$hermes_x/claim"; } 2>/dev/null || exit 0
	set +C
	# The output pipes are opened for writing only, but through a
	# read-write descriptor first, so the open never blocks: were hermes
	# gone, the command's first write fails instead.
	exec 4<>"$hermes_x/status" 7<>"$hermes_x/out" 5>"$hermes_x/out" 7<&- 7<>"$hermes_x/err" 6>"$hermes_x/err" 7<&-
	# The command's standard input: the pipe `in` when hermes made one
	# (it holds the write end already, so the open does not wait).
	if [ -p "$hermes_x/in" ]; then
		exec 9<"$hermes_x/in"
	else
		exec 9</dev/null
	fi
	printf 's\n' >&4
	# Each request file is emptied once read, before the command starts
	# (hermes removes them when it reads `e`).
	. "$hermes_x/cmd"
	{ : >"$hermes_x/cmd"; } 2>/dev/null
	if [ -n "$hermes_cwd" ]; then
		case $hermes_cwd in
		/*) ;;
		*)
			printf 'exec failed: Cwd must be an absolute path\n' >&5
			printf 'x 126\n' >&4
			exit 0
			;;
		esac
		if ! cd -P -- "$hermes_cwd" 2>/dev/null; then
			if [ ! -e "$hermes_cwd" ]; then
				hermes_why='no such file or directory'
			elif [ ! -d "$hermes_cwd" ]; then
				hermes_why='not a directory'
			else
				hermes_why='permission denied'
			fi
			printf 'exec failed: unable to start container process: chdir to cwd ("%s") failed: %s\n' "$hermes_cwd" "$hermes_why" >&5
			printf 'x 126\n' >&4
			exit 0
		fi
	fi
	for hermes_v in $hermes_drop; do
		unset "$hermes_v"
	done
	# Whether the program can be run, with the command's environment (its
	# PATH): in a subshell, so nothing it sets stays. $1 is how many words
	# of setsid come before the program.
	hermes_check() (
		shift "$1"
		shift
		set -f
		case $1 in
		*/*)
			if [ ! -e "$1" ]; then
				printf 'exec failed: unable to start container process: exec: "%s": stat %s: no such file or directory\n' "$1" "$1" >&5
				exit 1
			elif [ -d "$1" ] || [ ! -x "$1" ]; then
				printf 'exec failed: unable to start container process: exec: "%s": permission denied\n' "$1" >&5
				exit 1
			fi
			;;
		*)
			IFS=:
			for p in ${PATH-}; do
				[ -n "$p" ] || p=.
				if [ -f "$p/$1" ] && [ -x "$p/$1" ]; then
					exit 0
				fi
			done
			printf 'exec failed: unable to start container process: exec: "%s": executable file not found in $PATH\n' "$1" >&5
			exit 1
			;;
		esac
	)
	# The watch (run mode): hermes holds the write end of the pipe `life`
	# for as long as it waits for the command, and never writes to it. End
	# of file means hermes is gone, however it ended (kill -9 included):
	# the command's processes (those carrying its marker, and their
	# descendants) are killed. Its process id goes to the command's side as
	# a word, never a variable (the command's environment may set any).
	hermes_w=
	if [ "$hermes_mode" = run ] && [ -n "${hermes_id-}" ] && [ -p "$hermes_x/life" ]; then
		exec 7<>"$hermes_x/life" 8<"$hermes_x/life" 7<&-
		(
			read -r hermes_l <&8
			hermes_reap "$hermes_id"
		) </dev/null >/dev/null 2>&1 4>&- 5>&- 6>&- 9<&- &
		hermes_w=$!
		exec 8<&-
	fi
	# Once the environment is loaded no variable is read: it may set any.
	case $hermes_mode in
	bg)
		set -- "$hermes_x/env" "$hermes_s" -- "$hermes_s" -- "$@"
		unset hermes_x hermes_s hermes_drop hermes_v hermes_why hermes_mode hermes_cwd hermes_boot hermes_env hermes_n hermes_w hermes_id
		. "$1"
		{ : >"$1"; } 2>/dev/null
		shift
		printf 'e\n' >&4
		hermes_check 4 "$@" || {
			printf 'x 126\n' >&4
			exit 0
		}
		exec 5>&- 6>&-
		(exec "$@" </dev/null >/dev/null 2>&1 4>&- 9<&-)
		printf 'x 0\n' >&4
		;;
	*)
		set -- "$hermes_x/env" "$hermes_w" "$hermes_s" -- "$@"
		unset hermes_x hermes_s hermes_drop hermes_v hermes_why hermes_mode hermes_cwd hermes_boot hermes_env hermes_n hermes_w hermes_id
		. "$1"
		{ : >"$1"; } 2>/dev/null
		shift
		printf 'e\n' >&4
		# $1 is the watch's process id (or empty), then setsid -- CMD...
		hermes_check 3 "$@" || {
			[ -z "$1" ] || kill -KILL "$1" 2>/dev/null
			printf 'x 126\n' >&4
			exit 0
		}
		# In a subshell, so that what the shell says of how the command
		# ended ("Terminated") goes nowhere. Ended, its watch goes: what
		# the command left running in the background stays.
		(shift; exec "$@" <&9 >&5 2>&6 4>&- 5>&- 6>&- 9<&-)
		set -- "$?" "$1"
		[ -z "$2" ] || kill -KILL "$2" 2>/dev/null
		printf 'x %s\n' "$1" >&4
		;;
	esac
	;;
esac
