/* Native core of Projector.project_position (sim2real_ros/safety/projection.py).
 *
 * The Python module is the reference: every function here is a line-by-line port of the one
 * named in its comment, with the same operations in the same order (Python evaluates a * b * c
 * as (a * b) * c, as C does; min/max keep Python's tie and NaN rules; -ffp-contract=off keeps
 * multiply-adds unfused), so a command projected here is bit for bit the one the Python path
 * emits. The command state stays in the Projector's Python lists, which this code reads and
 * updates in place, so the two backends can be mixed call by call. Events are not built here:
 * the call returns per-joint limit codes and amounts, or the numbers of the Cartesian event,
 * and projection.py turns them into SafetyEvents.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#define MAX_JOINTS 32
/* Constants of projection.py (CONSTANTS below; test_safety_projection_native.py). */
#define TOL_ABS 1e-9
#define SNAP 1e-13
#define BISECT_STEPS 10
#define ROOT_WIDTH (1.0 / 1024.0) /* 0.5 ** _BISECT_STEPS */
#define ROOT_TOL 1e-12
#define CARTESIAN_STEPS 3
#define POS_GAIN 0.08
#define VEL_GAIN 0.25
#define LIMIT_SHARE 0.5

/* Python's max(a, b) and min(a, b) on floats: the first argument unless the second compares
 * strictly greater (smaller). */
#define PYMAX(a, b) ((b) > (a) ? (b) : (a))
#define PYMIN(a, b) ((b) < (a) ? (b) : (a))
#define ABS(v) ((v) >= 0.0 ? (v) : -(v))

/* Kinds of joint axes, as in kinematics.py. */
enum { AX_X = 0, AX_Y = 1, AX_Z = 2, AX_GENERAL = 3, AX_PRISMATIC = 4 };
/* Limit codes of _why and of the Cartesian event (the Python side names them). */
enum { WHY_POSITION = 0, WHY_VELOCITY, WHY_ACCELERATION, WHY_JERK, WHY_BRAKING };
enum { CART_WORKSPACE = 0, CART_TOOL_SPEED = 1 };

/* math.cos and math.sin call libm's cos and sin; called through volatile pointers so the
 * compiler cannot merge the pair into sincos (which a libm need not round the same way). */
static double (*volatile libm_cos)(double) = cos;
static double (*volatile libm_sin)(double) = sin;

typedef struct {
    double lo, hi, env_lo, env_hi, vmax, amax, jmax;
    double inv_j, inv_2j, inv_3j2, inv_2a, a_over_2j;
} Joint;

typedef struct {
    int k, kind, pure;
    double sign, ax, ay, az;
    double r[9], t[3];
} Link;

typedef struct {
    PyObject_HEAD
    int n;
    Joint j[MAX_JOINTS];
    Link chain[MAX_JOINTS]; /* tip to root, as ToolKinematics._rev */
    double tip[3];
    double box_lo[3], box_hi[3], box_margin, speed_max;
    double gains_dt;
    double gains[MAX_JOINTS][6];
} Core;

/* ---- per-joint helpers (projection.py module functions) ----------------------------- */

/* _d0 */
static double d0(double v, double amax, double jmax)
{
    if (v * jmax < amax * amax)
        return v * sqrt(v / jmax);
    return 0.5 * v * (v / amax + amax / jmax);
}

/* excursion_up */
static double excursion_up(double v, double a, double amax, double jmax)
{
    if (v < 0.0) {
        if (a <= 0.0)
            return 0.0;
        double disc = a * a + 2.0 * jmax * v;
        if (disc <= 0.0)
            return 0.0;
        v = 0.0;
        a = sqrt(disc);
    }
    if (a >= 0.0) {
        double v0 = v + a * a / (2.0 * jmax);
        return v * a / jmax + a * a * a / (3.0 * jmax * jmax) + d0(v0, amax, jmax);
    }
    if (a * a <= 2.0 * jmax * v) {
        double v0 = v + a * a / (2.0 * jmax);
        double t = -a / jmax;
        double r = d0(v0, amax, jmax) - (v0 * t - jmax * t * t * t / 6.0);
        return PYMAX(0.0, r);
    }
    double t = (-a - sqrt(a * a - 2.0 * jmax * v)) / jmax;
    double r = v * t + 0.5 * a * t * t + jmax * t * t * t / 6.0;
    return PYMAX(0.0, r);
}

/* peak_velocity_up */
static double peak_velocity_up(double v, double a, double jmax)
{
    return a > 0.0 ? v + a * a / (2.0 * jmax) : v;
}

/* _clearly_viable */
static int clearly_viable(const Joint *jt, double x, double v, double a)
{
    double av = ABS(v);
    double aa = ABS(a);
    double w = av + aa * aa * jt->inv_2j;
    if (w > jt->vmax)
        return 0;
    double e = av * aa * jt->inv_j + aa * aa * aa * jt->inv_3j2
               + w * (w * jt->inv_2a + jt->a_over_2j);
    return jt->lo + e <= x && x <= jt->hi - e;
}

typedef double (*violation_fn)(const Joint *, double, double, double, double, double);

/* _violation_up */
static double violation_up(const Joint *jt, double x, double v, double a, double j, double dt)
{
    double a2 = a + j * dt;
    double v2 = v + a2 * dt;
    double x2 = x + v2 * dt;
    double p = x2 + excursion_up(v2, a2, jt->amax, jt->jmax) - jt->hi;
    double s = (peak_velocity_up(v2, a2, jt->jmax) - jt->vmax) * dt;
    return PYMAX(p, s);
}

/* _violation_low */
static double violation_low(const Joint *jt, double x, double v, double a, double j, double dt)
{
    double a2 = a + j * dt;
    double v2 = v + a2 * dt;
    double x2 = x + v2 * dt;
    double p = jt->lo - (x2 - excursion_up(-v2, -a2, jt->amax, jt->jmax));
    double s = (peak_velocity_up(-v2, -a2, jt->jmax) - jt->vmax) * dt;
    return PYMAX(p, s);
}

/* _root */
static double root(violation_fn violation, const Joint *jt, double x, double v, double a,
                   double dt, double good, double f_good, double bad, double f_bad)
{
    double width = (bad - good) * ROOT_WIDTH;
    if (width < 0.0)
        width = -width;
    double prev = NAN, f_prev = NAN;
    double gap1 = INFINITY, gap2 = INFINITY, gap3 = INFINITY;
    const int budget = 2 * BISECT_STEPS;
    for (int k = 0; k < budget; k++) {
        double gap = bad - good;
        if (gap < 0.0)
            gap = -gap;
        if (gap <= width || f_good >= -ROOT_TOL)
            break;
        double mid;
        if (gap > 0.5 * gap3 || width * ldexp(1.0, budget - k - 1) <= gap) {
            mid = 0.5 * (good + bad);
            gap1 = gap2 = gap3 = INFINITY;
        }
        else {
            mid = NAN;
            if (f_prev == f_prev && f_good != f_prev)
                mid = good - f_good * (good - prev) / (f_good - f_prev);
            if (!((good < mid && mid < bad) || (bad < mid && mid < good)))
                mid = good + (bad - good) * (f_good / (f_good - f_bad));
            gap3 = gap2;
            gap2 = gap1;
            gap1 = gap;
            double step = mid - good;
            if (ABS(step) < width) {
                mid = bad > good ? good + 0.5 * width : good - 0.5 * width;
            }
            else {
                step = bad - mid;
                if (ABS(step) < width)
                    mid = bad > good ? bad - 0.5 * width : bad + 0.5 * width;
            }
        }
        double f_mid = violation(jt, x, v, a, mid, dt);
        if (f_mid <= 0.0) {
            prev = good;
            f_prev = f_good;
            good = mid;
            f_good = f_mid;
        }
        else {
            bad = mid;
            f_bad = f_mid;
            prev = f_prev = NAN;
        }
    }
    return good;
}

/* _viable_jerk */
static double viable_jerk(const Joint *jt, double x, double v, double a, double jd, double dt)
{
    double amax = jt->amax, jmax = jt->jmax;
    double t = (-amax - a) / dt;
    double jlo = PYMAX(-jmax, t);
    t = (amax - a) / dt;
    double jhi = PYMIN(jmax, t);
    if (jlo > jhi)
        jlo = jhi = a > 0.0 ? -jmax : jmax;
    double j = (jlo <= jd && jd <= jhi) ? jd : (jd < jlo ? jlo : jhi);
    double a2 = a + j * dt;
    double v2 = v + a2 * dt;
    double x2 = x + v2 * dt;
    if (clearly_viable(jt, x2, v2, a2))
        return j;
    double up = violation_up(jt, x, v, a, j, dt);
    double low = violation_low(jt, x, v, a, j, dt);
    if (up <= 0.0 && low <= 0.0)
        return j;
    if (up > 0.0) {
        double f_lo = violation_up(jt, x, v, a, jlo, dt);
        if (f_lo > 0.0)
            j = jlo;
        else
            j = root(violation_up, jt, x, v, a, dt, jlo, f_lo, j, up);
        if (violation_low(jt, x, v, a, j, dt) <= 0.0)
            return j;
    }
    else {
        double f_hi = violation_low(jt, x, v, a, jhi, dt);
        if (f_hi > 0.0)
            j = jhi;
        else
            j = root(violation_low, jt, x, v, a, dt, jhi, f_hi, j, low);
        if (violation_up(jt, x, v, a, j, dt) <= 0.0)
            return j;
    }
    double lo_j = jlo, hi_j = jhi;
    for (int k = 0; k < BISECT_STEPS; k++) {
        double mid = 0.5 * (lo_j + hi_j);
        if (violation_up(jt, x, v, a, mid, dt) > violation_low(jt, x, v, a, mid, dt))
            hi_j = mid;
        else
            lo_j = mid;
    }
    return 0.5 * (lo_j + hi_j);
}

/* _regula_falsi */
static double regula_falsi(double lo, double lo_s, double lo_b, double hi, double hi_s,
                           double hi_b)
{
    double share = hi;
    if (hi_s > 0.0)
        share = lo + (hi - lo) * (lo_s / (lo_s - hi_s));
    if (hi_b > 0.0) {
        double sb = lo + (hi - lo) * (lo_b / (lo_b - hi_b));
        if (sb < share)
            share = sb;
    }
    return share;
}

/* ---- kinematics (ToolKinematics.tool_position_and_levers) --------------------------- */

static void tool_position_and_levers(const Core *c, const double *q, double *levers,
                                     double *out)
{
    double x = c->tip[0], y = c->tip[1], z = c->tip[2];
    for (int m = 0; m < c->n; m++) {
        const Link *l = &c->chain[m];
        int k = l->k;
        double qk = q[k];
        double cq, s, nx, ny, nz;
        switch (l->kind) {
        case AX_Z:
            levers[k] = sqrt(x * x + y * y);
            cq = libm_cos(qk);
            s = libm_sin(qk) * l->sign;
            nx = cq * x - s * y;
            ny = s * x + cq * y;
            x = nx;
            y = ny;
            break;
        case AX_Y:
            levers[k] = sqrt(x * x + z * z);
            cq = libm_cos(qk);
            s = libm_sin(qk) * l->sign;
            nx = cq * x + s * z;
            nz = cq * z - s * x;
            x = nx;
            z = nz;
            break;
        case AX_X:
            levers[k] = sqrt(y * y + z * z);
            cq = libm_cos(qk);
            s = libm_sin(qk) * l->sign;
            ny = cq * y - s * z;
            nz = s * y + cq * z;
            y = ny;
            z = nz;
            break;
        case AX_GENERAL: {
            double ax = l->ax, ay = l->ay, az = l->az;
            double d = x * ax + y * ay + z * az;
            double r2 = x * x + y * y + z * z - d * d;
            levers[k] = sqrt(PYMAX(0.0, r2));
            cq = libm_cos(qk);
            s = libm_sin(qk) * l->sign;
            d = (ax * x + ay * y + az * z) * (1.0 - cq);
            double cx = ay * z - az * y, cy = az * x - ax * z, cz = ax * y - ay * x;
            nx = x * cq + cx * s + ax * d;
            ny = y * cq + cy * s + ay * d;
            nz = z * cq + cz * s + az * d;
            x = nx;
            y = ny;
            z = nz;
            break;
        }
        default:
            levers[k] = 1.0;
            x = x + l->ax * qk;
            y = y + l->ay * qk;
            z = z + l->az * qk;
        }
        if (l->pure) {
            x = x + l->t[0];
            y = y + l->t[1];
            z = z + l->t[2];
        }
        else {
            const double *r = l->r;
            nx = r[0] * x + r[1] * y + r[2] * z + l->t[0];
            ny = r[3] * x + r[4] * y + r[5] * z + l->t[1];
            nz = r[6] * x + r[7] * y + r[8] * z + l->t[2];
            x = nx;
            y = ny;
            z = nz;
        }
    }
    out[0] = x;
    out[1] = y;
    out[2] = z;
}

/* ---- Projector methods ---------------------------------------------------------------- */

typedef struct {
    int n;
    double dt;
    double x[MAX_JOINTS], v[MAX_JOINTS], a[MAX_JOINTS]; /* command state (updated) */
    double levers[MAX_JOINTS], fk_q[MAX_JOINTS];
    int have_fk;
    double fk_dist, last_speed, last_tail;
    double exc[MAX_JOINTS], w[MAX_JOINTS];
} State;

/* _STOP_TICKS_MAX and _STOP_TOL of projection.py */
#define STOP_TICKS_MAX 12
#define STOP_TOL 1e-9

/* _stop_q_max */
static double stop_q_max(int n, double s)
{
    double t = 0.5 * (s + n);
    double m = floor(t);
    if (m >= n)
        return 0.5 * n * (n + 1);
    double f = t - m;
    return -0.5 * n * (n + 1) + 2.0 * (m * n - 0.5 * m * (m - 1)) + 2.0 * f * (n - m);
}

/* _stop_u1_max */
static double stop_u1_max(int n, double s)
{
    double t = 0.5 * (s + n);
    return floor(t) >= 1 ? 1.0 : -1.0 + 2.0 * t;
}

/* _stops_in */
static int stops_in(int n, double p, double w)
{
    double s = -w;
    if (s > n + STOP_TOL || s < -n - STOP_TOL)
        return 0;
    if (s > n)
        s = (double)n;
    else if (s < -n)
        s = (double)(-n);
    double q = -p - n * w;
    double eps = STOP_TOL * (1.0 + (q >= 0.0 ? q : -q));
    return -stop_q_max(n, -s) - eps <= q && q <= stop_q_max(n, s) + eps;
}

/* _endgame_jerk */
static double endgame_jerk(double v, double a, double j, double jmax, double dt)
{
    double h = jmax * dt;
    double w = a / h;
    double p = v / (h * dt);
    double aw = w >= 0.0 ? w : -w;
    double ap = p >= 0.0 ? p : -p;
    int nmax = STOP_TICKS_MAX;
    if (aw > nmax + STOP_TOL || ap > 0.5 * nmax * (nmax + 1) + nmax * aw + 1.0)
        return j;
    int n = 1;
    for (;;) {
        double r = p + n * w;
        double ar = r >= 0.0 ? r : -r;
        if (aw <= n + STOP_TOL && ar - STOP_TOL * (1.0 + ar) <= 0.5 * n * (n + 1)
            && stops_in(n, p, w))
            break;
        n += 1;
        if (n > nmax)
            return j;
    }
    double u = j / jmax;
    if (n > 1 && stops_in(n - 1, p + w + u, w + u))
        return j;
    double s = -w;
    if (s > n)
        s = (double)n;
    else if (s < -n)
        s = (double)(-n);
    double q = -p - n * w;
    double hi = stop_q_max(n, s);
    double lo = -stop_q_max(n, -s);
    double lam = 0.5;
    if (hi > lo) {
        lam = (q - lo) / (hi - lo);
        if (lam < 0.0)
            lam = 0.0;
        else if (lam > 1.0)
            lam = 1.0;
    }
    return (lam * stop_u1_max(n, s) - (1.0 - lam) * stop_u1_max(n, -s)) * jmax;
}

/* Projector._brake_into, always with the bounds (its only use here is _cartesian_brake). */
static void brake_into(const Core *c, State *st, const double *x_base, double *out,
                       double *speed_out, double *tail_out)
{
    double dt = st->dt;
    double speed = 0.0, tail = 0.0;
    for (int i = c->n - 1; i >= 0; i--) {
        const Joint *jt = &c->j[i];
        double vi = st->v[i], ai = st->a[i], xi = x_base[i];
        double jmax = jt->jmax, amax = jt->amax;
        double jlo = (-amax - ai) / dt;
        double jhi = (amax - ai) / dt;
        double j, an = 0.0, vn = 0.0, xn = 0.0, w = 0.0, e = 0.0;
        int viable;
        if (jlo < -jmax)
            jlo = -jmax;
        if (jhi > jmax)
            jhi = jmax;
        if (jlo > jhi) {
            j = ai > 0.0 ? -jmax : jmax;
            viable = 0;
        }
        else {
            if (ABS(vi) <= 0.5 * jmax * dt * dt && ABS(ai) <= 0.5 * jmax * dt) {
                j = (-vi / dt - ai) / dt;
            }
            else {
                double s = (vi > 0.0 || (vi == 0.0 && ai > 0.0)) ? 1.0 : -1.0;
                double vs = s * vi, as_ = s * ai, jm;
                if (as_ < 0.0 && as_ * as_ >= 2.0 * jmax * vs)
                    jm = vs > 0.0 ? as_ * as_ / (2.0 * vs) : jmax;
                else if (as_ <= -amax)
                    jm = 0.0;
                else
                    jm = -jmax;
                j = endgame_jerk(vi, ai, s * (jm < jmax ? jm : jmax), jmax, dt);
            }
            if (j < jlo)
                j = jlo;
            else if (j > jhi)
                j = jhi;
            an = ai + j * dt;
            vn = vi + an * dt;
            xn = xi + vn * dt;
            double av = ABS(vn), aa = ABS(an);
            w = av + aa * aa * jt->inv_2j;
            e = av * aa * jt->inv_j + aa * aa * aa * jt->inv_3j2
                + w * (w * jt->inv_2a + jt->a_over_2j);
            viable = w <= jt->vmax && jt->lo + e <= xn && xn <= jt->hi - e;
        }
        if (!viable) {
            j = viable_jerk(jt, xi, vi, ai, j, dt);
            an = ai + j * dt;
            vn = vi + an * dt;
            xn = xi + vn * dt;
            double av = ABS(vn), aa = ABS(an);
            w = av + aa * aa * jt->inv_2j;
            e = av * aa * jt->inv_j + aa * aa * aa * jt->inv_3j2
                + w * (w * jt->inv_2a + jt->a_over_2j);
        }
        out[i] = j;
        double step = xn - xi;
        if (step < 0.0)
            step = -step;
        if (step > e)
            e = step;
        double d = xn - st->fk_q[i];
        if (d < 0.0)
            d = -d;
        double lk = st->levers[i] + tail;
        speed += lk * w;
        tail += lk * (e + d);
    }
    *speed_out = speed;
    *tail_out = tail;
}

/* Projector._trial_bounds */
static void trial_bounds(const Core *c, const State *st, double share, const double *brake,
                         const double *jerks, const double *x_base, double *speed_out,
                         double *tail_out)
{
    double dt = st->dt;
    double speed = 0.0, tail = 0.0;
    for (int k = c->n - 1; k >= 0; k--) {
        const Joint *jt = &c->j[k];
        double b = brake[k];
        double ak = st->a[k] + (b + share * (jerks[k] - b)) * dt;
        double vk = st->v[k] + ak * dt;
        double xb = x_base[k];
        double xk = xb + vk * dt;
        double av = ABS(vk), aa = ABS(ak);
        double w = av + aa * aa * jt->inv_2j;
        double e = av * aa * jt->inv_j + aa * aa * aa * jt->inv_3j2
                   + w * (w * jt->inv_2a + jt->a_over_2j);
        double step = xk - xb;
        if (step < 0.0)
            step = -step;
        if (step > e)
            e = step;
        double d = xk - st->fk_q[k];
        if (d < 0.0)
            d = -d;
        double lk = st->levers[k] + tail;
        speed += lk * w;
        tail += lk * (e + d);
    }
    *speed_out = speed;
    *tail_out = tail;
}

/* Projector._blend_share */
static double blend_share(const Core *c, const State *st, const double *brake,
                          const double *jerks, const double *x_base, double speed0,
                          double tail0)
{
    double speed_max = c->speed_max, margin = c->box_margin, dist = st->fk_dist;
    double hi_s = st->last_speed - speed_max, hi_b = st->last_tail + margin - dist;
    double lo_s = speed0 - speed_max, lo_b = tail0 + margin - dist;
    if (lo_s > 0.0 || lo_b > 0.0)
        return 0.0;
    double lo = 0.0, hi = 1.0;
    for (int k = 0; k < CARTESIAN_STEPS - 1; k++) {
        double share = regula_falsi(lo, lo_s, lo_b, hi, hi_s, hi_b);
        if (!(lo < share && share < hi))
            break;
        double speed, tail;
        trial_bounds(c, st, share, brake, jerks, x_base, &speed, &tail);
        double g_s = speed - speed_max, g_b = tail + margin - dist;
        if (g_s <= 0.0 && g_b <= 0.0)
            return share;
        hi = share;
        hi_s = g_s;
        hi_b = g_b;
    }
    return lo;
}

/* Projector._why for a position command: the code and amount of the first limit broken. */
static int why(const Joint *jt, double req, double out, double x_prev, double v_prev,
               double a_prev, double dt, double *amount)
{
    if (req > jt->env_hi) {
        *amount = req - jt->env_hi;
        return WHY_POSITION;
    }
    if (req < jt->env_lo) {
        *amount = jt->env_lo - req;
        return WHY_POSITION;
    }
    double v_req = (req - x_prev) / dt;
    if (fabs(v_req) > jt->vmax) {
        *amount = fabs(v_req) - jt->vmax;
        return WHY_VELOCITY;
    }
    double a_req = (v_req - v_prev) / dt;
    if (fabs(a_req) > jt->amax) {
        *amount = fabs(a_req) - jt->amax;
        return WHY_ACCELERATION;
    }
    double j_req = (a_req - a_prev) / dt;
    if (fabs(j_req) > jt->jmax) {
        *amount = fabs(j_req) - jt->jmax;
        return WHY_JERK;
    }
    *amount = fabs(out - req);
    return WHY_BRAKING;
}

/* ---- Python glue ---------------------------------------------------------------------- */

static int read_floats(PyObject *list, int n, double *out, const char *what)
{
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) != n) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of %d floats", what, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(list, i);
        if (PyFloat_CheckExact(o)) {
            out[i] = PyFloat_AS_DOUBLE(o);
        }
        else {
            out[i] = PyFloat_AsDouble(o);
            if (out[i] == -1.0 && PyErr_Occurred())
                return -1;
        }
    }
    return 0;
}

/* r_prev lists: float or None per joint (None: no history). */
static int read_optional(PyObject *list, int n, double *out, int *have, const char *what)
{
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) != n) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of %d floats or None", what, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(list, i);
        if (o == Py_None) {
            have[i] = 0;
            out[i] = 0.0;
            continue;
        }
        have[i] = 1;
        out[i] = PyFloat_AsDouble(o);
        if (out[i] == -1.0 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

static PyObject *new_float_list(int n, const double *vals)
{
    PyObject *list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *f = PyFloat_FromDouble(vals[i]);
        if (f == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, f);
    }
    return list;
}

static double item_float(PyObject *seq, Py_ssize_t i, int *err)
{
    PyObject *o = PySequence_GetItem(seq, i);
    if (o == NULL) {
        *err = 1;
        return 0.0;
    }
    double v = PyFloat_AsDouble(o);
    Py_DECREF(o);
    if (v == -1.0 && PyErr_Occurred())
        *err = 1;
    return v;
}

/* Read row `i` of `seq` as exactly `width` floats into `out`; -1 with an exception if not. */
static int read_row(PyObject *seq, Py_ssize_t i, int width, double *out, const char *what)
{
    PyObject *row = PySequence_GetItem(seq, i);
    if (row == NULL)
        return -1;
    if (PySequence_Size(row) != width) {
        Py_DECREF(row);
        PyErr_SetString(PyExc_ValueError, what);
        return -1;
    }
    int err = 0;
    for (int k = 0; k < width; k++)
        out[k] = item_float(row, k, &err);
    Py_DECREF(row);
    return err ? -1 : 0;
}

/* Core(joints, chain, tip, box_lo, box_hi, box_margin, speed_max)
 *
 * joints: per joint (lo, hi, env_lo, env_hi, vmax, amax, jmax, inv_j, inv_2j, inv_3j2,
 * inv_2a, a_over_2j), the fields of projection._Joint; chain: ToolKinematics._rev; tip:
 * ToolKinematics._tip. */
static int Core_init(Core *self, PyObject *args, PyObject *kwds)
{
    PyObject *joints, *chain, *tip, *box_lo, *box_hi;
    double box_margin, speed_max;
    static char *kwlist[] = {"joints", "chain", "tip", "box_lo", "box_hi", "box_margin",
                             "speed_max", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOdd", kwlist, &joints, &chain, &tip,
                                     &box_lo, &box_hi, &box_margin, &speed_max))
        return -1;
    Py_ssize_t n = PySequence_Size(joints);
    if (n < 0)
        return -1;
    if (n < 1 || n > MAX_JOINTS) {
        PyErr_Format(PyExc_ValueError, "expected 1 to %d joints, got %zd", MAX_JOINTS, n);
        return -1;
    }
    if (PySequence_Size(chain) != n) {
        PyErr_Format(PyExc_ValueError, "expected a chain of %zd joints", n);
        return -1;
    }
    int err = 0;
    self->n = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        double f[12];
        if (read_row(joints, i, 12, f, "a joint row has 12 numbers") < 0)
            return -1;
        Joint *jt = &self->j[i];
        jt->lo = f[0];
        jt->hi = f[1];
        jt->env_lo = f[2];
        jt->env_hi = f[3];
        jt->vmax = f[4];
        jt->amax = f[5];
        jt->jmax = f[6];
        jt->inv_j = f[7];
        jt->inv_2j = f[8];
        jt->inv_3j2 = f[9];
        jt->inv_2a = f[10];
        jt->a_over_2j = f[11];
    }
    for (Py_ssize_t m = 0; m < n; m++) {
        double f[19];
        if (read_row(chain, m, 19, f, "a chain row has 19 entries") < 0)
            return -1;
        Link *l = &self->chain[m];
        l->k = (int)f[0];
        l->kind = (int)f[1];
        if (l->k < 0 || l->k >= n || l->kind < AX_X || l->kind > AX_PRISMATIC) {
            PyErr_SetString(PyExc_ValueError, "bad chain row");
            return -1;
        }
        l->sign = f[2];
        l->ax = f[3];
        l->ay = f[4];
        l->az = f[5];
        l->pure = f[6] != 0.0;
        for (int k = 0; k < 9; k++)
            l->r[k] = f[7 + k];
        for (int k = 0; k < 3; k++)
            l->t[k] = f[16 + k];
    }
    for (int k = 0; k < 3; k++) {
        self->tip[k] = item_float(tip, k, &err);
        self->box_lo[k] = item_float(box_lo, k, &err);
        self->box_hi[k] = item_float(box_hi, k, &err);
    }
    if (err)
        return -1;
    self->box_margin = box_margin;
    self->speed_max = speed_max;
    self->gains_dt = NAN;
    return 0;
}

/* Projector._cascade_gains */
static void cascade_gains(Core *c, double dt)
{
    for (int i = 0; i < c->n; i++) {
        double gp = POS_GAIN / dt, lp = c->j[i].amax * LIMIT_SHARE;
        double gv = VEL_GAIN / dt, lv = c->j[i].jmax * LIMIT_SHARE;
        c->gains[i][0] = gp;
        c->gains[i][1] = lp / (gp * gp);
        c->gains[i][2] = 2.0 * lp;
        c->gains[i][3] = gv;
        c->gains[i][4] = lv / (gv * gv);
        c->gains[i][5] = 2.0 * lv;
    }
    c->gains_dt = dt;
}

/* Core.project_position(req, dt, x, v, a, r_prev, r_prev2, synced, levers, fk_q, fk_dist)
 *
 * The body of Projector.project_position after its input checks, with _cartesian_check,
 * _commit_exact and _cartesian_brake. Updates x, v, a, synced and (when the kinematics are
 * evaluated) levers in place; returns (command, status, deviation, fk, info): status 0
 * committed, info a tuple of (joint, limit code, amount) per intervening joint; status 1
 * braked on the Cartesian check, info (limit code, excess, px, py, pz, dist, tail, speed,
 * speed_max). fk: None, or (fk_q, fk_dist, last_speed, last_tail) when the kinematics were
 * evaluated at the candidate. Raises TypeError (state untouched) on malformed arguments. */
static PyObject *Core_project_position(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "project_position takes 11 arguments");
        return NULL;
    }
    const Core *c = self;
    const int n = c->n;
    State st;
    double req[MAX_JOINTS], r1v[MAX_JOINTS], r2v[MAX_JOINTS];
    int r1h[MAX_JOINTS], r2h[MAX_JOINTS], synced[MAX_JOINTS];
    PyObject *synced_list = args[7], *levers_list = args[8], *fk_q_obj = args[9];
    st.n = n;
    st.dt = PyFloat_AsDouble(args[1]);
    if (st.dt == -1.0 && PyErr_Occurred())
        return NULL;
    if (read_floats(args[0], n, req, "req") || read_floats(args[2], n, st.x, "x")
        || read_floats(args[3], n, st.v, "v") || read_floats(args[4], n, st.a, "a")
        || read_optional(args[5], n, r1v, r1h, "r_prev")
        || read_optional(args[6], n, r2v, r2h, "r_prev2")
        || read_floats(levers_list, n, st.levers, "levers"))
        return NULL;
    if (!PyList_CheckExact(synced_list) || PyList_GET_SIZE(synced_list) != n) {
        PyErr_Format(PyExc_TypeError, "synced must be a list of %d bools", n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        int t = PyObject_IsTrue(PyList_GET_ITEM(synced_list, i));
        if (t < 0)
            return NULL;
        synced[i] = t;
    }
    st.have_fk = fk_q_obj != Py_None;
    if (st.have_fk && read_floats(fk_q_obj, n, st.fk_q, "fk_q"))
        return NULL;
    st.fk_dist = PyFloat_AsDouble(args[10]);
    if (st.fk_dist == -1.0 && PyErr_Occurred())
        return NULL;

    const double dt = st.dt;
    if (!(dt == self->gains_dt))
        cascade_gains(self, dt);
    const double dt2 = dt * dt, dt3 = dt * dt * dt;
    double jerks[MAX_JOINTS], x2[MAX_JOINTS];
    const int certify = st.have_fk;
    double speed = 0.0, tail = 0.0;
    for (int i = n - 1; i >= 0; i--) {
        const Joint *jt = &c->j[i];
        const double *g = c->gains[i];
        double r = req[i];
        double xi = st.x[i], vi = st.v[i], ai = st.a[i];
        double jmax = jt->jmax, amax = jt->amax, vmax = jt->vmax;
        double j = (r - xi - vi * dt - ai * dt2) / dt3;
        double an = ai + j * dt;
        double vn = vi + an * dt;
        int exact = -jmax <= j && j <= jmax && -amax <= an && an <= amax && -vmax <= vn
                    && vn <= vmax;
        if (!exact || !synced[i]) {
            double vr, ar;
            if (!r1h[i]) {
                vr = ar = 0.0;
            }
            else {
                double r1 = r1v[i];
                vr = (r - r1) / dt;
                ar = !r2h[i] ? 0.0 : (vr - (r1 - r2v[i]) / dt) / dt;
                if (!(-vmax <= vr && vr <= vmax && -amax <= ar && ar <= amax))
                    vr = ar = 0.0;
            }
            if (exact) {
                double dv = vn - vr;
                double da = an - ar;
                exact = ABS(dv) <= 0.5 * jmax * dt2 && ABS(da) <= 0.5 * jmax * dt;
            }
            if (!exact) {
                double gp = g[0], lin_p = g[1], two_lp = g[2];
                double gv = g[3], lin_v = g[4], two_lv = g[5];
                double err = r - xi - vr * dt, cc, lim;
                if (err > lin_p)
                    cc = sqrt(two_lp * (err - 0.5 * lin_p));
                else if (err < -lin_p)
                    cc = -sqrt(two_lp * (-err - 0.5 * lin_p));
                else
                    cc = err * gp;
                lim = (err > 0.0 ? err : -err) / dt;
                if (cc > lim)
                    cc = lim;
                else if (cc < -lim)
                    cc = -lim;
                double vd = vr + cc;
                if (vd > vmax)
                    vd = vmax;
                else if (vd < -vmax)
                    vd = -vmax;
                err = vd - vi - ar * dt;
                if (err > lin_v)
                    cc = sqrt(two_lv * (err - 0.5 * lin_v));
                else if (err < -lin_v)
                    cc = -sqrt(two_lv * (-err - 0.5 * lin_v));
                else
                    cc = err * gv;
                lim = (err > 0.0 ? err : -err) / dt;
                if (cc > lim)
                    cc = lim;
                else if (cc < -lim)
                    cc = -lim;
                double ad = ar + cc;
                if (ad > amax)
                    ad = amax;
                else if (ad < -amax)
                    ad = -amax;
                j = (ad - ai) / dt;
            }
        }
        double jlo = (-amax - ai) / dt;
        double jhi = (amax - ai) / dt;
        if (jlo < -jmax)
            jlo = -jmax;
        if (jhi > jmax)
            jhi = jmax;
        int viable = 0;
        double xn = 0.0, w = 0.0, e = 0.0;
        if (jlo <= jhi) {
            if (j < jlo) {
                j = jlo;
                exact = 0;
            }
            else if (j > jhi) {
                j = jhi;
                exact = 0;
            }
            if (!exact) {
                an = ai + j * dt;
                vn = vi + an * dt;
            }
            xn = xi + vn * dt;
            double av = ABS(vn), aa = ABS(an);
            w = av + aa * aa * jt->inv_2j;
            e = av * aa * jt->inv_j + aa * aa * aa * jt->inv_3j2
                + w * (w * jt->inv_2a + jt->a_over_2j);
            viable = w <= vmax && jt->lo + e <= xn && xn <= jt->hi - e;
        }
        if (!viable) {
            j = viable_jerk(jt, xi, vi, ai, j, dt);
            an = ai + j * dt;
            vn = vi + an * dt;
            xn = xi + vn * dt;
            double av = ABS(vn), aa = ABS(an);
            w = av + aa * aa * jt->inv_2j;
            e = av * aa * jt->inv_j + aa * aa * aa * jt->inv_3j2
                + w * (w * jt->inv_2a + jt->a_over_2j);
        }
        double step = xn - xi;
        if (step < 0.0)
            step = -step;
        if (step > e)
            e = step;
        st.exc[i] = e;
        st.w[i] = w;
        if (certify) {
            double d = xn - st.fk_q[i];
            if (d < 0.0)
                d = -d;
            double lk = st.levers[i] + tail;
            speed += lk * w;
            tail += lk * (e + d);
        }
        jerks[i] = j;
        x2[i] = xn;
    }

    /* _cartesian_check(x2, cached=False) unless the cached kinematics certify x2. */
    int failed = -1;
    double excess = 0.0, pos[3] = {0.0, 0.0, 0.0};
    int evaluated = 0;
    if (!(certify && speed <= c->speed_max && st.fk_dist - tail >= c->box_margin)) {
        tool_position_and_levers(c, x2, st.levers, pos);
        const double *lo = c->box_lo, *hi = c->box_hi;
        double dist = pos[0] - lo[0], t;
        t = hi[0] - pos[0];
        dist = PYMIN(dist, t);
        t = pos[1] - lo[1];
        dist = PYMIN(dist, t);
        t = hi[1] - pos[1];
        dist = PYMIN(dist, t);
        t = pos[2] - lo[2];
        dist = PYMIN(dist, t);
        t = hi[2] - pos[2];
        dist = PYMIN(dist, t);
        memcpy(st.fk_q, x2, sizeof(double) * n);
        st.have_fk = 1;
        st.fk_dist = dist;
        evaluated = 1;
        speed = tail = 0.0;
        for (int k = n - 1; k >= 0; k--) {
            double lk = st.levers[k] + tail;
            speed += lk * st.w[k];
            tail += lk * st.exc[k];
        }
        st.last_speed = speed;
        st.last_tail = tail;
        if (dist < tail + c->box_margin) {
            failed = CART_WORKSPACE;
            excess = tail + c->box_margin - dist;
        }
        else if (speed > c->speed_max) {
            failed = CART_TOOL_SPEED;
            excess = speed - c->speed_max;
        }
    }

    double out[MAX_JOINTS], xs[MAX_JOINTS], vs[MAX_JOINTS], as[MAX_JOINTS];
    int new_synced[MAX_JOINTS];
    int why_joint[MAX_JOINTS], why_code[MAX_JOINTS];
    double why_amount[MAX_JOINTS];
    int n_why = 0;
    double deviation = 0.0;
    if (failed < 0) {
        /* _commit_exact(req, x2, dt, events, synced) */
        for (int i = 0; i < n; i++) {
            double xi = x2[i];
            double r = req[i];
            double d = xi > r ? xi - r : r - xi;
            int tracked = 1;
            out[i] = xi;
            if (d != 0.0) {
                double scale = 1.0 + (r > 0.0 ? r : -r);
                if (d <= SNAP * scale) {
                    xi = out[i] = r;
                }
                else if (d > TOL_ABS * scale) {
                    tracked = 0;
                    why_joint[n_why] = i;
                    why_code[n_why] = why(&c->j[i], r, xi, st.x[i], st.v[i], st.a[i], dt,
                                          &why_amount[n_why]);
                    n_why++;
                    if (d > deviation)
                        deviation = d;
                }
            }
            new_synced[i] = tracked;
            double xo = st.x[i], vo = st.v[i];
            double vnew = (xi - xo) / dt;
            as[i] = (vnew - vo) / dt;
            vs[i] = vnew;
            xs[i] = xi;
        }
    }
    else {
        /* _cartesian_brake(POSITION, req, jerks, dt, events, x, reason, synced) */
        double brake[MAX_JOINTS], speed0, tail0;
        brake_into(c, &st, st.x, brake, &speed0, &tail0);
        double share = blend_share(c, &st, brake, jerks, st.x, speed0, tail0);
        for (int i = 0; i < n; i++) {
            double b = brake[i];
            double ai = st.a[i] + (b + share * (jerks[i] - b)) * dt;
            double vi = st.v[i] + ai * dt;
            double xi = st.x[i] + vi * dt;
            double o = out[i] = xi;
            double vnew = (xi - st.x[i]) / dt;
            as[i] = (vnew - st.v[i]) / dt;
            vs[i] = vnew;
            xs[i] = xi;
            double r = req[i];
            double d = o - r;
            if (d < 0.0)
                d = -d;
            int beyond = d > TOL_ABS * (1.0 + (r >= 0.0 ? r : -r));
            if (beyond && d > deviation)
                deviation = d;
            new_synced[i] = !beyond;
        }
    }

    /* Results first (allocation can fail), then the state, which cannot. */
    PyObject *cmd = new_float_list(n, out);
    PyObject *fk = NULL, *info = NULL, *x_new = NULL, *v_new = NULL, *a_new = NULL;
    PyObject *lev_new = NULL;
    if (cmd == NULL)
        goto fail;
    if (evaluated) {
        PyObject *q = new_float_list(n, st.fk_q);
        if (q == NULL)
            goto fail;
        fk = Py_BuildValue("(Nddd)", q, st.fk_dist, st.last_speed, st.last_tail);
        if (fk == NULL)
            goto fail;
        lev_new = new_float_list(n, st.levers);
        if (lev_new == NULL)
            goto fail;
    }
    else {
        fk = Py_NewRef(Py_None);
    }
    if (failed < 0) {
        info = PyTuple_New(n_why);
        if (info == NULL)
            goto fail;
        for (int k = 0; k < n_why; k++) {
            PyObject *row = Py_BuildValue("(iid)", why_joint[k], why_code[k], why_amount[k]);
            if (row == NULL)
                goto fail;
            PyTuple_SET_ITEM(info, k, row);
        }
    }
    else {
        info = Py_BuildValue("(idddddddd)", failed, excess, pos[0], pos[1], pos[2], st.fk_dist,
                             st.last_tail, st.last_speed, c->speed_max);
        if (info == NULL)
            goto fail;
    }
    x_new = new_float_list(n, xs);
    v_new = new_float_list(n, vs);
    a_new = new_float_list(n, as);
    if (x_new == NULL || v_new == NULL || a_new == NULL)
        goto fail;
    /* Move the new floats into the state lists (the same objects the Projector holds). */
    for (int i = 0; i < n; i++) {
        PyObject *o;
        o = PyList_GET_ITEM(x_new, i);
        Py_INCREF(o);
        PyList_SetItem(args[2], i, o);
        o = PyList_GET_ITEM(v_new, i);
        Py_INCREF(o);
        PyList_SetItem(args[3], i, o);
        o = PyList_GET_ITEM(a_new, i);
        Py_INCREF(o);
        PyList_SetItem(args[4], i, o);
        PyObject *b = new_synced[i] ? Py_True : Py_False;
        Py_INCREF(b);
        PyList_SetItem(synced_list, i, b);
        if (lev_new != NULL) {
            o = PyList_GET_ITEM(lev_new, i);
            Py_INCREF(o);
            PyList_SetItem(levers_list, i, o);
        }
    }
    Py_DECREF(x_new);
    Py_DECREF(v_new);
    Py_DECREF(a_new);
    Py_XDECREF(lev_new);
    return Py_BuildValue("(NidNN)", cmd, failed < 0 ? 0 : 1, deviation, fk, info);

fail:
    Py_XDECREF(cmd);
    Py_XDECREF(fk);
    Py_XDECREF(info);
    Py_XDECREF(x_new);
    Py_XDECREF(v_new);
    Py_XDECREF(a_new);
    Py_XDECREF(lev_new);
    return NULL;
}

static PyMethodDef Core_methods[] = {
    {"project_position", (PyCFunction)(void (*)(void))Core_project_position, METH_FASTCALL,
     "Project a position command on the Projector's state lists (see projection.py)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sim2real_ros.safety._projection.Core",
    .tp_doc = "Per-joint limits and kinematic chain of one Projector (one envelope scale).",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_methods = Core_methods,
};

static struct PyModuleDef projection_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_projection",
    .m_doc = "Native core of sim2real_ros.safety.projection.Projector.project_position.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__projection(void)
{
    if (PyType_Ready(&CoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&projection_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MAX_JOINTS", MAX_JOINTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    /* The constants shared with projection.py, so a test can hold the two equal. */
    PyObject *consts = Py_BuildValue(
        "{sdsdsisdsdsisdsdsdsisd}", "_TOL_ABS", TOL_ABS, "_SNAP", SNAP, "_BISECT_STEPS",
        BISECT_STEPS, "_ROOT_WIDTH", ROOT_WIDTH, "_ROOT_TOL", ROOT_TOL, "_CARTESIAN_STEPS",
        CARTESIAN_STEPS, "_POS_GAIN", POS_GAIN, "_VEL_GAIN", VEL_GAIN, "_LIMIT_SHARE",
        LIMIT_SHARE, "_STOP_TICKS_MAX", STOP_TICKS_MAX, "_STOP_TOL", STOP_TOL);
    if (consts == NULL || PyModule_AddObject(m, "CONSTANTS", consts) < 0) {
        Py_XDECREF(consts);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
