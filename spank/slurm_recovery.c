/*
 * slurm_recovery.so: the SPANK plugin of slurm-recovery (docs/spank.md).
 *
 * Job options:  --recovery=auto|monitor|off   --recovery-max-restarts=N (0-100)
 *               --recovery-hang-timeout=DURATION (10s..24h)   --recovery-progress=REGEX
 * Plugin args:  default=auto|monitor|off  max_restarts=N  hang_timeout=DURATION
 *               (a bad argument is logged and ignored: site typos never fail jobs)
 *
 * sbatch/salloc/srun (allocator, local): each option is checked when it is parsed (a bad
 * value refuses the submission); then the settings, with the site defaults filled in, go
 * into the job control environment, which Slurm hands to the Prolog/Epilog as
 * SPANK_SRECOVERY_RECOVERY_MODE, SPANK_SRECOVERY_RECOVERY_MAX_RESTARTS,
 * SPANK_SRECOVERY_RECOVERY_HANG_TIMEOUT (seconds) and SPANK_SRECOVERY_RECOVERY_PROGRESS.
 * slurmstepd (remote): the same settings go into every task's environment, without the
 * SPANK_ prefix (SRECOVERY_RECOVERY_MODE, ...).
 */
#include <errno.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(slurm_recovery, 1);

#define PROGRESS_MAX 512
#define HANG_MIN 10L
#define HANG_MAX 86400L
#define RESTARTS_MAX 100L

enum { OPT_MODE = 1, OPT_MAX_RESTARTS, OPT_HANG_TIMEOUT, OPT_PROGRESS };

/* What the user asked for (NULL / -1: not given) and the site defaults. */
static const char *opt_mode;
static long opt_max_restarts = -1;
static long opt_hang_timeout = -1;
static char *opt_progress;
static const char *def_mode;
static long def_max_restarts = -1;
static long def_hang_timeout = -1;

static const char *const MODES[] = {"auto", "monitor", "off", NULL};

static const char *mode_of(const char *s)
{
	for (int i = 0; s && MODES[i]; i++)
		if (strcmp(s, MODES[i]) == 0)
			return MODES[i];
	return NULL;
}

/* A whole non-negative decimal number in [lo, hi]; -1 otherwise. */
static long number_of(const char *s, long lo, long hi)
{
	char *end;
	long v;

	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -1;
	return v;
}

/* Seconds in "90", "90s", "10m", "1h", "1h30m" within [HANG_MIN, HANG_MAX]; -1 otherwise. */
static long duration_of(const char *s)
{
	long total = 0;

	if (!s || !*s)
		return -1;
	while (*s) {
		char *end;
		long v, unit;

		if (*s < '0' || *s > '9')
			return -1;
		errno = 0;
		v = strtol(s, &end, 10);
		if (errno || v > HANG_MAX)
			return -1;
		switch (*end) {
		case 's': unit = 1; end++; break;
		case 'm': unit = 60; end++; break;
		case 'h': unit = 3600; end++; break;
		case '\0': unit = 1; break;
		default: return -1;
		}
		total += v * unit;
		if (total > HANG_MAX)
			return -1;
		s = end;
	}
	return (total >= HANG_MIN) ? total : -1;
}

/* NULL when the regex is acceptable, else why not (static text). */
static const char *progress_problem(const char *s)
{
	regex_t re;
	size_t groups;

	if (!s || !*s)
		return "is empty";
	if (strlen(s) > PROGRESS_MAX)
		return "is longer than 512 characters";
	if (regcomp(&re, s, REG_EXTENDED) != 0)
		return "does not compile as a POSIX extended regular expression";
	groups = re.re_nsub;
	regfree(&re);
	if (groups < 1)
		return "has no capture group ( ) for the step number";
	return NULL;
}

static int check_option(int val, const char *arg)
{
	const char *why;

	switch (val) {
	case OPT_MODE:
		opt_mode = mode_of(arg);
		if (!opt_mode) {
			slurm_error("slurm_recovery: --recovery=%s: invalid value; "
				    "accepted values: auto, monitor, off", arg ? arg : "");
			return -1;
		}
		return 0;
	case OPT_MAX_RESTARTS:
		opt_max_restarts = number_of(arg, 0, RESTARTS_MAX);
		if (opt_max_restarts < 0) {
			slurm_error("slurm_recovery: --recovery-max-restarts=%s: invalid value; "
				    "accepted values: a whole number from 0 to 100", arg ? arg : "");
			return -1;
		}
		return 0;
	case OPT_HANG_TIMEOUT:
		opt_hang_timeout = duration_of(arg);
		if (opt_hang_timeout < 0) {
			slurm_error("slurm_recovery: --recovery-hang-timeout=%s: invalid value; "
				    "accepted values: a duration from 10s to 24h "
				    "(e.g. 90s, 10m, 1h, 1h30m; a plain number is seconds)",
				    arg ? arg : "");
			return -1;
		}
		return 0;
	case OPT_PROGRESS:
		why = progress_problem(arg);
		if (why) {
			slurm_error("slurm_recovery: --recovery-progress: the regular expression "
				    "%s; accepted values: a POSIX extended regex of at most 512 "
				    "characters with a capture group for the step number, "
				    "e.g. 'step ([0-9]+)'", why);
			return -1;
		}
		free(opt_progress);
		opt_progress = strdup(arg);
		return opt_progress ? 0 : -1;
	}
	return -1;
}

/*
 * Refuse a bad value where the user typed it (sbatch/salloc/srun). On the node (remote: the
 * value was already accepted at submission, so only a different plugin version gets here)
 * the value is dropped and the job runs: fail open.
 */
static int option_cb(int val, const char *arg, int remote)
{
	if (check_option(val, arg) == 0)
		return 0;
	return remote ? 0 : -1;
}

static struct spank_option options[] = {
	{"recovery", "auto|monitor|off",
	 "slurm-recovery mode for this job: auto (recover it), monitor (advise only), off",
	 1, OPT_MODE, option_cb},
	{"recovery-max-restarts", "N",
	 "slurm-recovery: restart this job at most N times (0-100)",
	 1, OPT_MAX_RESTARTS, option_cb},
	{"recovery-hang-timeout", "DURATION",
	 "slurm-recovery: no progress for DURATION (10s-24h, e.g. 90s, 10m, 1h) is a hang",
	 1, OPT_HANG_TIMEOUT, option_cb},
	{"recovery-progress", "REGEX",
	 "slurm-recovery: POSIX extended regex for progress lines in the job's output, "
	 "with a capture group for the step number",
	 1, OPT_PROGRESS, option_cb},
	SPANK_OPTIONS_TABLE_END
};

/* Plugin arguments from plugstack.conf; anything wrong is logged and ignored. */
static void parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		const char *a = av[i];
		const char *v = strchr(a, '=');

		if (!v) {
			slurm_error("slurm_recovery: plugstack.conf argument '%s' ignored: "
				    "expected default=, max_restarts= or hang_timeout=", a);
			continue;
		}
		v++;
		if (strncmp(a, "default=", 8) == 0) {
			if (mode_of(v))
				def_mode = mode_of(v);
			else
				slurm_error("slurm_recovery: plugstack.conf argument '%s' ignored: "
					    "default must be auto, monitor or off", a);
		} else if (strncmp(a, "max_restarts=", 13) == 0) {
			long n = number_of(v, 0, RESTARTS_MAX);
			if (n >= 0)
				def_max_restarts = n;
			else
				slurm_error("slurm_recovery: plugstack.conf argument '%s' ignored: "
					    "max_restarts must be a whole number from 0 to 100", a);
		} else if (strncmp(a, "hang_timeout=", 13) == 0) {
			long n = duration_of(v);
			if (n >= 0)
				def_hang_timeout = n;
			else
				slurm_error("slurm_recovery: plugstack.conf argument '%s' ignored: "
					    "hang_timeout must be a duration from 10s to 24h", a);
		} else {
			slurm_error("slurm_recovery: plugstack.conf argument '%s' ignored: "
				    "expected default=, max_restarts= or hang_timeout=", a);
		}
	}
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();

	if (ctx == S_CTX_SLURMD || ctx == S_CTX_JOB_SCRIPT)
		return 0;  /* nothing to do in slurmd proper or the prolog/epilog */
	parse_args(ac, av);
	for (int i = 0; options[i].name; i++) {
		if (spank_option_register(sp, &options[i]) != ESPANK_SUCCESS)
			slurm_error("slurm_recovery: cannot register --%s", options[i].name);
	}
	return 0;  /* fail open */
}

typedef spank_err_t (*setenv_f)(spank_t, const char *, const char *, int);

static void put(spank_t sp, setenv_f set, const char *name, const char *value)
{
	spank_err_t rc = set(sp, name, value, 1);

	if (rc != ESPANK_SUCCESS)
		slurm_error("slurm_recovery: cannot set %s: %s", name, spank_strerror(rc));
}

static void put_long(spank_t sp, setenv_f set, const char *name, long value)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%ld", value);
	put(sp, set, name, buf);
}

/* Options are parsed by now (locally, or forwarded to slurmstepd): publish the settings. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	setenv_f set;
	const char *mode = opt_mode ? opt_mode : def_mode;
	long restarts = opt_max_restarts >= 0 ? opt_max_restarts : def_max_restarts;
	long hang = opt_hang_timeout >= 0 ? opt_hang_timeout : def_hang_timeout;

	(void) ac;
	(void) av;
	if (ctx == S_CTX_ALLOCATOR || ctx == S_CTX_LOCAL)
		set = spank_job_control_setenv;  /* the Prolog/Epilog get SPANK_<name> */
	else if (ctx == S_CTX_REMOTE)
		set = spank_setenv;  /* the tasks */
	else
		return 0;
	if (mode)
		put(sp, set, "SRECOVERY_RECOVERY_MODE", mode);
	if (restarts >= 0)
		put_long(sp, set, "SRECOVERY_RECOVERY_MAX_RESTARTS", restarts);
	if (hang >= 0)
		put_long(sp, set, "SRECOVERY_RECOVERY_HANG_TIMEOUT", hang);
	if (opt_progress)
		put(sp, set, "SRECOVERY_RECOVERY_PROGRESS", opt_progress);
	return 0;  /* fail open */
}
