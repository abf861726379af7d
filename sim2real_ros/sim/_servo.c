/* The plant's physics-step loop in C: joint servo + PyBullet's C API, many steps a call.
 *
 * `ArmPlant.advance_steps` in Python (sim/plant.py) is the reference. Each physics step it
 *   1. reads the chain joints and the F/T joint (pybullet.getJointStates),
 *   2. computes the drive torque per joint (cascade PD / velocity loop / effort, saturation,
 *      first-order motor lag) and subtracts the viscous damping,
 *   3. records the pre-step state in the history ring (for delayed sensors),
 *   4. sends the torques (pybullet.setJointMotorControlArray, TORQUE_CONTROL) and
 *   5. steps (pybullet.stepSimulation).
 * This file does the same five things with the same PyBullet C-API calls that pybullet's own
 * wrappers make (b3RequestActualStateCommandInit / b3GetJointState,
 * b3JointControlCommandInit2 / b3JointControlSetDesiredForceTorque, b3InitStepSimulationCommand),
 * and the same floating-point operations in the same order (built with -ffp-contract=off), so a
 * trajectory is bit for bit the Python one. What it saves is the Python interpreter and the
 * wrappers' argument parsing and tuple building: about half of a physics step's cost.
 *
 * The C API functions are exported by pybullet's own extension module and looked up there with
 * dlsym; the client handle of a pybullet client id is read by the Python side (sim/_pbnative.py)
 * from pybullet's client table, and checked against pybullet.getJointStates before use.
 * The servo gains are refreshed every `gain_every` steps from the two mass matrices (actual and
 * nominal arm) with the same diagonal-of-inverse routine as the Python reference
 * (`plant._inv_diag`), and `sense` turns a history row (or a fresh read) into what the encoders
 * and the F/T sensor report, drawing its random numbers from blocks of the same numpy generator
 * streams that the Python reference draws from one call at a time (sim/core.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAXJ 64

typedef struct b3PhysicsClientHandle__* b3PhysicsClientHandle;
typedef struct b3SharedMemoryCommandHandle__* b3SharedMemoryCommandHandle;
typedef struct b3SharedMemoryStatusHandle__* b3SharedMemoryStatusHandle;

/* SharedMemoryPublic.h: the state of one joint as the server reports it. */
struct b3JointSensorState {
    double m_jointPosition;
    double m_jointVelocity;
    double m_jointForceTorque[6];
    double m_jointMotorTorque;
};

typedef int (*can_submit_fn)(b3PhysicsClientHandle);
typedef b3SharedMemoryStatusHandle (*submit_fn)(b3PhysicsClientHandle, b3SharedMemoryCommandHandle);
typedef int (*status_type_fn)(b3SharedMemoryStatusHandle);
typedef b3SharedMemoryCommandHandle (*step_init_fn)(b3PhysicsClientHandle);
typedef b3SharedMemoryCommandHandle (*state_init_fn)(b3PhysicsClientHandle, int);
typedef int (*joint_state_fn)(b3PhysicsClientHandle, b3SharedMemoryStatusHandle, int,
                              struct b3JointSensorState*);
typedef b3SharedMemoryCommandHandle (*control_init_fn)(b3PhysicsClientHandle, int, int);
typedef int (*set_force_fn)(b3SharedMemoryCommandHandle, int, double);
typedef b3SharedMemoryCommandHandle (*mass_init_fn)(b3PhysicsClientHandle, int, const double*, int);
typedef void (*mass_flags_fn)(b3SharedMemoryCommandHandle, int);
typedef int (*mass_get_fn)(b3PhysicsClientHandle, b3SharedMemoryStatusHandle, int*, double*);

static struct {
    int bound;
    can_submit_fn can_submit;
    submit_fn submit;
    status_type_fn status_type;
    step_init_fn step_init;
    state_init_fn state_init;
    joint_state_fn joint_state;
    control_init_fn control_init;
    set_force_fn set_force;
    mass_init_fn mass_init;
    mass_flags_fn mass_flags;
    mass_get_fn mass_get;
} api;

static PyObject* bind(PyObject* self, PyObject* arg) {
    (void)self;
    const char* path = PyUnicode_AsUTF8(arg);
    if (path == NULL) return NULL;
    /* pybullet is already imported, so this only finds the loaded module. */
    void* lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "dlopen(%s) failed: %s", path, dlerror());
        return NULL;
    }
    struct { const char* name; void** slot; } syms[] = {
        {"b3CanSubmitCommand", (void**)&api.can_submit},
        {"b3SubmitClientCommandAndWaitStatus", (void**)&api.submit},
        {"b3GetStatusType", (void**)&api.status_type},
        {"b3InitStepSimulationCommand", (void**)&api.step_init},
        {"b3RequestActualStateCommandInit", (void**)&api.state_init},
        {"b3GetJointState", (void**)&api.joint_state},
        {"b3JointControlCommandInit2", (void**)&api.control_init},
        {"b3JointControlSetDesiredForceTorque", (void**)&api.set_force},
        {"b3CalculateMassMatrixCommandInit", (void**)&api.mass_init},
        {"b3CalculateMassMatrixSetFlags", (void**)&api.mass_flags},
        {"b3GetStatusMassMatrix", (void**)&api.mass_get},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void* p = dlsym(lib, syms[i].name);
        if (p == NULL) {
            api.bound = 0;
            PyErr_Format(PyExc_ImportError, "%s has no symbol %s", path, syms[i].name);
            return NULL;
        }
        *syms[i].slot = p;
    }
    api.bound = 1;
    Py_RETURN_NONE;
}

enum { MODE_POSITION = 0, MODE_VELOCITY = 1, MODE_EFFORT = 2 };

typedef struct {
    PyObject_HEAD
    b3PhysicsClientHandle sm;
    int body;
    int n;          /* chain joints */
    int nread;      /* chain joints + the F/T joint when there is one */
    int has_ft;
    int torque_mode;
    int state_ok;   /* status type of a good actual-state reply */
    int read_idx[MAXJ + 1];
    int dof_idx[MAXJ];
    double kp[MAXJ], kd[MAXJ], kpos[MAXJ], damp[MAXJ];
    double lim[MAXJ], alpha[MAXJ], vmax[MAXJ];
    int lagged;
    int mode;
    double target[MAXJ];
    double tau[MAXJ];      /* applied motor torque of the last step (tau_prev) */
    double q_last[MAXJ];   /* the last state read (before the last step) */
    double qd_last[MAXJ];
    /* history ring: (hist_len, n) q, qd, tau and (hist_len, 6) raw F/T reaction */
    Py_buffer hq, hqd, htau, hft;
    int hist_len;
    /* gain model (set_gain_model): refreshed every gain_every steps inside advance() */
    int has_gain_model;
    b3PhysicsClientHandle nsm;
    int nbody;
    int gain_every;
    int dof_sel[MAXJ];
    double kp_pi[MAXJ], kd_pi[MAXJ], damping[MAXJ], dt;
    double kp_raw[MAXJ], kd_raw[MAXJ];
    /* sensing (set_sensor / set_latency / set_normals / set_uniforms) */
    int has_sensor;
    double bias[MAXJ], drift_sigma[MAXJ], std3[3 * MAXJ], drift[MAXJ];
    int noisy, drifting;
    double pq_inv[MAXJ], pq_step[MAXJ], vq_inv[MAXJ], vq_step[MAXJ];
    int pq_on[MAXJ], vq_on[MAXJ], pq_any, vq_any;
    double ft_bias[6], ft_std[6];
    int ft_noise;
    double ft_rot[9], ft_com[3];
    double obs_delay, obs_jitter, obs_drop;
    int has_drift_stamp;
    double drift_stamp, last_stamp;
    int has_last_obs;
    Py_buffer nbuf, ubuf;
    Py_ssize_t nlen, ulen, nidx, uidx;
    int has_n, has_u;
} Servo;

static void release_history(Servo* s) {
    if (s->hist_len > 0) {
        PyBuffer_Release(&s->hq);
        PyBuffer_Release(&s->hqd);
        PyBuffer_Release(&s->htau);
        PyBuffer_Release(&s->hft);
    }
    s->hist_len = 0;
}

static void release_blocks(Servo* s) {
    if (s->has_n) PyBuffer_Release(&s->nbuf);
    if (s->has_u) PyBuffer_Release(&s->ubuf);
    s->has_n = s->has_u = 0;
    s->nlen = s->ulen = s->nidx = s->uidx = 0;
}

static void Servo_dealloc(Servo* s) {
    release_history(s);
    release_blocks(s);
    Py_TYPE(s)->tp_free((PyObject*)s);
}

/* A sequence of exactly n items as a fast sequence (new reference), or NULL with an error. */
static PyObject* exact_items(PyObject* seq, int n, const char* what) {
    PyObject* fast = PySequence_Fast(seq, what);
    if (fast == NULL) return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "%s: expected %d values, got %zd", what, n,
                     PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return NULL;
    }
    return fast;
}

static int read_doubles(PyObject* seq, double* out, int n, const char* what) {
    PyObject* fast = exact_items(seq, n, what);
    if (fast == NULL) return -1;
    PyObject** items = PySequence_Fast_ITEMS(fast);
    for (int i = 0; i < n; i++) {
        double v = PyFloat_AsDouble(items[i]);
        if (v == -1.0 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        out[i] = v;
    }
    Py_DECREF(fast);
    return 0;
}

static int read_ints(PyObject* seq, int* out, int n, const char* what) {
    PyObject* fast = exact_items(seq, n, what);
    if (fast == NULL) return -1;
    PyObject** items = PySequence_Fast_ITEMS(fast);
    for (int i = 0; i < n; i++) {
        long v = PyLong_AsLong(items[i]);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        out[i] = (int)v;
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject* to_list(const double* v, int n) {
    PyObject* out = PyList_New(n);
    if (out == NULL) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject* f = PyFloat_FromDouble(v[i]);
        if (f == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, f);
    }
    return out;
}

/* Read the joints; returns 0 on success, -1 with an exception set. */
static int read_state(Servo* s, struct b3JointSensorState* st) {
    if (!api.can_submit(s->sm)) {
        PyErr_SetString(PyExc_RuntimeError, "pybullet client cannot take commands (disconnected?)");
        return -1;
    }
    b3SharedMemoryStatusHandle status = api.submit(s->sm, api.state_init(s->sm, s->body));
    if (status == NULL || api.status_type(status) != s->state_ok) {
        PyErr_SetString(PyExc_RuntimeError, "pybullet actual-state request failed");
        return -1;
    }
    for (int j = 0; j < s->nread; j++) {
        if (!api.joint_state(s->sm, status, s->read_idx[j], &st[j])) {
            PyErr_Format(PyExc_RuntimeError, "pybullet has no state for joint %d", s->read_idx[j]);
            return -1;
        }
    }
    return 0;
}

/* Servo(handle, body, read_idx, dof_idx, has_ft, torque_mode) */
static int Servo_init(Servo* s, PyObject* args, PyObject* kw) {
    (void)kw;
    unsigned long long handle;
    PyObject *read, *dof;
    if (!api.bound) {
        PyErr_SetString(PyExc_RuntimeError, "_servo.bind(pybullet path) was not called");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "KiOOpi", &handle, &s->body, &read, &dof, &s->has_ft,
                          &s->torque_mode))
        return -1;
    if (handle == 0) {
        PyErr_SetString(PyExc_ValueError, "null pybullet client handle");
        return -1;
    }
    s->sm = (b3PhysicsClientHandle)(uintptr_t)handle;
    Py_ssize_t nd = PySequence_Size(dof);
    if (nd < 1 || nd > MAXJ) {
        PyErr_Format(PyExc_ValueError, "dof_idx: expected 1..%d joints", MAXJ);
        return -1;
    }
    s->n = (int)nd;
    s->nread = s->n + (s->has_ft ? 1 : 0);
    if (read_ints(read, s->read_idx, s->nread, "read_idx") < 0) return -1;
    if (read_ints(dof, s->dof_idx, s->n, "dof_idx") < 0) return -1;
    for (int j = 0; j < s->n; j++) {
        s->kp[j] = s->kd[j] = s->kpos[j] = s->damp[j] = 0.0;
        s->lim[j] = 1e9;
        s->alpha[j] = 1.0;
        s->vmax[j] = 1e9;
        s->target[j] = s->tau[j] = s->q_last[j] = s->qd_last[j] = 0.0;
    }
    s->lagged = 0;
    s->mode = MODE_POSITION;
    s->hist_len = 0;
    s->has_gain_model = 0;
    s->has_sensor = 0;
    s->has_n = s->has_u = 0;
    s->nlen = s->ulen = s->nidx = s->uidx = 0;
    s->has_drift_stamp = 0;
    s->last_stamp = 0.0;
    s->has_last_obs = 0;
    s->obs_delay = s->obs_jitter = s->obs_drop = 0.0;
    if (!api.can_submit(s->sm)) {
        PyErr_SetString(PyExc_RuntimeError, "pybullet client handle cannot take commands");
        return -1;
    }
    b3SharedMemoryStatusHandle status = api.submit(s->sm, api.state_init(s->sm, s->body));
    if (status == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pybullet actual-state request failed");
        return -1;
    }
    s->state_ok = api.status_type(status);
    return 0;
}

/* rebind(body, read_idx, dof_idx, has_ft): the arm was reloaded in the same client (new body
 * id); everything else (gains model, sensor state, history, command) is kept. */
static PyObject* Servo_rebind(Servo* s, PyObject* args) {
    PyObject *read, *dof;
    int body, has_ft;
    if (!PyArg_ParseTuple(args, "iOOp", &body, &read, &dof, &has_ft)) return NULL;
    if (PySequence_Size(dof) != s->n) {
        PyErr_Format(PyExc_ValueError, "rebind: expected %d joints", s->n);
        return NULL;
    }
    int nread = s->n + (has_ft ? 1 : 0);
    int ridx[MAXJ + 1], didx[MAXJ];
    if (read_ints(read, ridx, nread, "read_idx") < 0) return NULL;
    if (read_ints(dof, didx, s->n, "dof_idx") < 0) return NULL;
    s->body = body;
    s->has_ft = has_ft;
    s->nread = nread;
    memcpy(s->read_idx, ridx, sizeof(int) * nread);
    memcpy(s->dof_idx, didx, sizeof(int) * s->n);
    if (!api.can_submit(s->sm)) {
        PyErr_SetString(PyExc_RuntimeError, "pybullet client handle cannot take commands");
        return NULL;
    }
    b3SharedMemoryStatusHandle status = api.submit(s->sm, api.state_init(s->sm, s->body));
    if (status == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pybullet actual-state request failed");
        return NULL;
    }
    s->state_ok = api.status_type(status);
    Py_RETURN_NONE;
}

/* read() -> list of (q, qd) per read joint and the F/T reaction: for the handle self-check. */
static PyObject* Servo_read(Servo* s, PyObject* noargs) {
    (void)noargs;
    struct b3JointSensorState st[MAXJ + 1];
    if (read_state(s, st) < 0) return NULL;
    PyObject* out = PyList_New(s->nread);
    if (out == NULL) return NULL;
    for (int j = 0; j < s->nread; j++) {
        PyObject* t = Py_BuildValue("(dd(dddddd))", st[j].m_jointPosition, st[j].m_jointVelocity,
                                    st[j].m_jointForceTorque[0], st[j].m_jointForceTorque[1],
                                    st[j].m_jointForceTorque[2], st[j].m_jointForceTorque[3],
                                    st[j].m_jointForceTorque[4], st[j].m_jointForceTorque[5]);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j, t);
    }
    return out;
}

/* set_limits(lim, alpha, vmax, lagged) */
static PyObject* Servo_set_limits(Servo* s, PyObject* args) {
    PyObject *lim, *alpha, *vmax;
    int lagged;
    if (!PyArg_ParseTuple(args, "OOOp", &lim, &alpha, &vmax, &lagged)) return NULL;
    if (read_doubles(lim, s->lim, s->n, "lim") < 0 ||
        read_doubles(alpha, s->alpha, s->n, "alpha") < 0 ||
        read_doubles(vmax, s->vmax, s->n, "vmax") < 0)
        return NULL;
    s->lagged = lagged;
    Py_RETURN_NONE;
}

/* set_command(mode, target): mode 0 position, 1 velocity, 2 effort. */
static PyObject* Servo_set_command(Servo* s, PyObject* args) {
    int mode;
    PyObject* target;
    if (!PyArg_ParseTuple(args, "iO", &mode, &target)) return NULL;
    if (mode < MODE_POSITION || mode > MODE_EFFORT) {
        PyErr_Format(PyExc_ValueError, "mode = %d: expected 0, 1 or 2", mode);
        return NULL;
    }
    if (read_doubles(target, s->target, s->n, "target") < 0) return NULL;
    s->mode = mode;
    Py_RETURN_NONE;
}

/* set_tau(values): the motor torque the lag filter starts from. */
static PyObject* Servo_set_tau(Servo* s, PyObject* arg) {
    if (read_doubles(arg, s->tau, s->n, "tau") < 0) return NULL;
    Py_RETURN_NONE;
}

static int get_2d(PyObject* obj, Py_buffer* b, int rows, int cols, const char* what) {
    if (PyObject_GetBuffer(obj, b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (b->itemsize != sizeof(double) || strcmp(b->format, "d") != 0 ||
        b->len != (Py_ssize_t)rows * cols * (Py_ssize_t)sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous float64 (%d, %d) array",
                     what, rows, cols);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* set_history(q, qd, tau, ft) with (L, n), (L, n), (L, n), (L, 6) float64 arrays, or
 * set_history() to switch it off. */
static PyObject* Servo_set_history(Servo* s, PyObject* args) {
    PyObject *q = NULL, *qd = NULL, *tau = NULL, *ft = NULL;
    if (!PyArg_ParseTuple(args, "|OOOO", &q, &qd, &tau, &ft)) return NULL;
    release_history(s);
    if (q == NULL) Py_RETURN_NONE;
    if (qd == NULL || tau == NULL || ft == NULL) {
        PyErr_SetString(PyExc_TypeError, "set_history takes four arrays or none");
        return NULL;
    }
    Py_buffer bq;
    if (PyObject_GetBuffer(q, &bq, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (bq.ndim != 2 || bq.itemsize != sizeof(double)) {
        PyBuffer_Release(&bq);
        PyErr_SetString(PyExc_ValueError, "history q: expected a 2-d float64 array");
        return NULL;
    }
    int rows = (int)bq.shape[0];
    PyBuffer_Release(&bq);
    if (rows < 1) {
        PyErr_SetString(PyExc_ValueError, "history: expected at least one row");
        return NULL;
    }
    if (get_2d(q, &s->hq, rows, s->n, "history q") < 0) return NULL;
    if (get_2d(qd, &s->hqd, rows, s->n, "history qd") < 0) {
        PyBuffer_Release(&s->hq);
        return NULL;
    }
    if (get_2d(tau, &s->htau, rows, s->n, "history tau") < 0) {
        PyBuffer_Release(&s->hq);
        PyBuffer_Release(&s->hqd);
        return NULL;
    }
    if (get_2d(ft, &s->hft, rows, 6, "history ft") < 0) {
        PyBuffer_Release(&s->hq);
        PyBuffer_Release(&s->hqd);
        PyBuffer_Release(&s->htau);
        return NULL;
    }
    s->hist_len = rows;
    Py_RETURN_NONE;
}

static int update_gains(Servo* s);

/* advance(k, step0): k physics steps; step0 is the plant's step count before the first (it
 * places history rows). Returns None; q_last/qd_last/tau hold the results. */
static PyObject* Servo_advance(Servo* s, PyObject* args) {
    int k;
    long long step0;
    if (!PyArg_ParseTuple(args, "iL", &k, &step0)) return NULL;
    struct b3JointSensorState st[MAXJ + 1];
    double tau[MAXJ];
    const int n = s->n;
    if (!s->has_gain_model) {
        PyErr_SetString(PyExc_RuntimeError, "set_gain_model was not called");
        return NULL;
    }
    for (int step = 0; step < k; step++) {
        if ((step0 + step) % s->gain_every == 0) {
            if (update_gains(s) < 0) return NULL;
        }
        if (read_state(s, st) < 0) return NULL;
        b3SharedMemoryCommandHandle cmd = api.control_init(s->sm, s->body, s->torque_mode);
        for (int j = 0; j < n; j++) {
            const double qj = st[j].m_jointPosition;
            const double qdj = st[j].m_jointVelocity;
            double t;
            if (s->mode == MODE_POSITION) {
                double v = s->kpos[j] * (s->target[j] - qj);
                const double vl = s->vmax[j];
                if (v > vl)
                    v = vl;
                else if (v < -vl)
                    v = -vl;
                t = s->kd[j] > 0 ? s->kd[j] * (v - qdj) : s->kp[j] * (s->target[j] - qj);
            } else if (s->mode == MODE_VELOCITY) {
                double v = s->target[j];
                const double vl = s->vmax[j];
                if (v > vl)
                    v = vl;
                else if (v < -vl)
                    v = -vl;
                t = s->kd[j] * (v - qdj);
            } else {
                t = s->target[j];
            }
            const double lj = s->lim[j];
            if (t > lj)
                t = lj;
            else if (t < -lj)
                t = -lj;
            if (s->lagged) t = s->tau[j] + s->alpha[j] * (t - s->tau[j]);
            tau[j] = t;
            api.set_force(cmd, s->dof_idx[j], t - s->damp[j] * qdj);
        }
        if (s->hist_len > 0) {
            const long long i = (step0 + step) % s->hist_len;
            double* hq = (double*)s->hq.buf + i * n;
            double* hqd = (double*)s->hqd.buf + i * n;
            double* ht = (double*)s->htau.buf + i * n;
            for (int j = 0; j < n; j++) {
                hq[j] = st[j].m_jointPosition;
                hqd[j] = st[j].m_jointVelocity;
                ht[j] = s->tau[j];
            }
            double* hf = (double*)s->hft.buf + i * 6;
            for (int c = 0; c < 6; c++) hf[c] = s->has_ft ? st[n].m_jointForceTorque[c] : 0.0;
        }
        api.submit(s->sm, cmd);
        if (!api.can_submit(s->sm)) {
            PyErr_SetString(PyExc_RuntimeError, "pybullet client cannot take commands");
            return NULL;
        }
        api.submit(s->sm, api.step_init(s->sm));
        for (int j = 0; j < n; j++) {
            s->tau[j] = tau[j];
            s->q_last[j] = st[j].m_jointPosition;
            s->qd_last[j] = st[j].m_jointVelocity;
        }
    }
    Py_RETURN_NONE;
}

/* Diagonal of the inverse of an n x n row-major matrix by Gauss-Jordan elimination with partial
 * pivoting (first largest |pivot|). Returns 0, or -1 when a pivot is exactly zero. The Python
 * reference `plant._inv_diag` performs the same operations in the same order. */
static int inv_diag(const double* m, int n, double* out) {
    double a[MAXJ][2 * MAXJ];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) a[i][j] = m[i * n + j];
        for (int j = 0; j < n; j++) a[i][n + j] = (i == j) ? 1.0 : 0.0;
    }
    for (int col = 0; col < n; col++) {
        int piv = col;
        double best = fabs(a[col][col]);
        for (int r = col + 1; r < n; r++) {
            double v = fabs(a[r][col]);
            if (v > best) {
                best = v;
                piv = r;
            }
        }
        if (a[piv][col] == 0.0) return -1;
        if (piv != col) {
            for (int j = 0; j < 2 * n; j++) {
                double t = a[col][j];
                a[col][j] = a[piv][j];
                a[piv][j] = t;
            }
        }
        double p = a[col][col];
        for (int j = 0; j < 2 * n; j++) a[col][j] = a[col][j] / p;
        for (int r = 0; r < n; r++) {
            if (r == col) continue;
            double f = a[r][col];
            if (f != 0.0) {
                for (int j = 0; j < 2 * n; j++) a[r][j] = a[r][j] - f * a[col][j];
            }
        }
    }
    for (int i = 0; i < n; i++) out[i] = a[i][n + i];
    return 0;
}

/* 1/(M^-1)_jj of the chain joints at q (the inertia each joint sees with the others free). */
static int free_inertia(Servo* s, b3PhysicsClientHandle sm, int body, const double* q, double* out) {
    const int n = s->n;
    if (!api.can_submit(sm)) {
        PyErr_SetString(PyExc_RuntimeError, "pybullet client cannot take commands");
        return -1;
    }
    b3SharedMemoryCommandHandle cmd = api.mass_init(sm, body, q, n);
    api.mass_flags(cmd, 0);
    b3SharedMemoryStatusHandle status = api.submit(sm, cmd);
    int dof = 0;
    if (status == NULL || !api.mass_get(sm, status, &dof, NULL) || dof != n) {
        PyErr_Format(PyExc_RuntimeError, "pybullet mass matrix: expected %d dofs, got %d", n, dof);
        return -1;
    }
    double m[MAXJ * MAXJ];
    api.mass_get(sm, status, NULL, m);
    double d[MAXJ];
    if (inv_diag(m, n, d) < 0) {
        for (int j = 0; j < n; j++) out[j] = m[s->dof_sel[j] * n + s->dof_sel[j]];
        return 0;
    }
    for (int j = 0; j < n; j++) {
        double v = d[s->dof_sel[j]];
        out[j] = 1.0 / (v > 1e-12 ? v : 1e-12);
    }
    return 0;
}

/* The reference's ArmPlant._update_gains, on the last joint positions read. */
static int update_gains(Servo* s) {
    const int n = s->n;
    double m_nom[MAXJ], m_act[MAXJ];
    if (free_inertia(s, s->nsm, s->nbody, s->q_last, m_nom) < 0) return -1;
    if (free_inertia(s, s->sm, s->body, s->q_last, m_act) < 0) return -1;
    for (int j = 0; j < n; j++) {
        double md = m_act[j] > 1e-9 ? m_act[j] : 1e-9;
        double mn = m_nom[j] > 1e-9 ? m_nom[j] : 1e-9;
        double kp = s->kp_pi[j] * mn;
        double kd = s->kd_pi[j] * mn;
        double c = (kd + s->damping[j]) * s->dt / md;
        double over = c - 0.5;
        double scale = 1.0 / (1.0 + (over > 0.0 ? over : 0.0));
        s->kp_raw[j] = kp;
        s->kd_raw[j] = kd;
        s->damp[j] = s->damping[j] * scale;
        s->kd[j] = kd * scale;
        s->kp[j] = kp * scale;
        s->kpos[j] = kd > 0 ? kp / (kd > 1e-300 ? kd : 1e-300) : 0.0;
    }
    return 0;
}

/* set_gain_model(nominal_handle, nominal_body, dof_sel, kp_per_inertia, kd_per_inertia,
 *                damping, dt, gain_every) */
static PyObject* Servo_set_gain_model(Servo* s, PyObject* args) {
    unsigned long long nh;
    PyObject *sel, *kp, *kd, *damping;
    if (!PyArg_ParseTuple(args, "KiOOOOdi", &nh, &s->nbody, &sel, &kp, &kd, &damping, &s->dt,
                          &s->gain_every))
        return NULL;
    if (nh == 0 || s->gain_every < 1) {
        PyErr_SetString(PyExc_ValueError, "set_gain_model: null handle or gain_every < 1");
        return NULL;
    }
    if (read_ints(sel, s->dof_sel, s->n, "dof_sel") < 0 ||
        read_doubles(kp, s->kp_pi, s->n, "kp_per_inertia") < 0 ||
        read_doubles(kd, s->kd_pi, s->n, "kd_per_inertia") < 0 ||
        read_doubles(damping, s->damping, s->n, "damping") < 0)
        return NULL;
    for (int j = 0; j < s->n; j++) {
        if (s->dof_sel[j] < 0 || s->dof_sel[j] >= s->n) {
            PyErr_SetString(PyExc_ValueError, "dof_sel out of range");
            return NULL;
        }
    }
    s->nsm = (b3PhysicsClientHandle)(uintptr_t)nh;
    s->has_gain_model = 1;
    Py_RETURN_NONE;
}

/* update_gains() -> None: refresh now (reset, new parameters). */
static PyObject* Servo_update_gains(Servo* s, PyObject* noargs) {
    (void)noargs;
    if (!s->has_gain_model) {
        PyErr_SetString(PyExc_RuntimeError, "no gain model set");
        return NULL;
    }
    if (update_gains(s) < 0) return NULL;
    Py_RETURN_NONE;
}

/* gains() -> (kp, kd, kp_eff, kd_eff, kpos, damp_eff) lists */
static PyObject* Servo_gains(Servo* s, PyObject* noargs) {
    (void)noargs;
    return Py_BuildValue("(NNNNNN)", to_list(s->kp_raw, s->n), to_list(s->kd_raw, s->n),
                         to_list(s->kp, s->n), to_list(s->kd, s->n), to_list(s->kpos, s->n),
                         to_list(s->damp, s->n));
}

/* set_q(q, qd): the last state read, after the plant writes a joint state itself. */
static PyObject* Servo_set_q(Servo* s, PyObject* args) {
    PyObject *q, *qd;
    if (!PyArg_ParseTuple(args, "OO", &q, &qd)) return NULL;
    if (read_doubles(q, s->q_last, s->n, "q") < 0 || read_doubles(qd, s->qd_last, s->n, "qd") < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The wrench the tool side exerts on the arm, sensor frame, from PyBullet's raw reaction
 * (ArmPlant._raw_to_wrench, same operations). */
static void raw_to_wrench(const Servo* s, const double* raw, double* w) {
    const double* r = s->ft_rot;
    double fx = raw[0], fy = raw[1], fz = raw[2], mx = raw[3], my = raw[4], mz = raw[5];
    double f0 = r[0] * fx + r[1] * fy + r[2] * fz;
    double f1 = r[3] * fx + r[4] * fy + r[5] * fz;
    double f2 = r[6] * fx + r[7] * fy + r[8] * fz;
    double m0 = r[0] * mx + r[1] * my + r[2] * mz;
    double m1 = r[3] * mx + r[4] * my + r[5] * mz;
    double m2 = r[6] * mx + r[7] * my + r[8] * mz;
    double cx = s->ft_com[0], cy = s->ft_com[1], cz = s->ft_com[2];
    w[0] = -f0;
    w[1] = -f1;
    w[2] = -f2;
    w[3] = -(m0 + cy * f2 - cz * f1);
    w[4] = -(m1 + cz * f0 - cx * f2);
    w[5] = -(m2 + cx * f1 - cy * f0);
}

/* state(out) -> None: a fresh read (like ArmPlant.state) into out = [q(n), qd(n), wrench(6)];
 * updates the last state read. */
static int fresh_state(Servo* s, double* q, double* qd, double* w) {
    struct b3JointSensorState st[MAXJ + 1];
    if (read_state(s, st) < 0) return -1;
    for (int j = 0; j < s->n; j++) {
        q[j] = st[j].m_jointPosition;
        qd[j] = st[j].m_jointVelocity;
        s->q_last[j] = q[j];
        s->qd_last[j] = qd[j];
    }
    if (s->has_ft)
        raw_to_wrench(s, st[s->n].m_jointForceTorque, w);
    else
        for (int c = 0; c < 6; c++) w[c] = 0.0;
    return 0;
}

static int get_vec(PyObject* obj, Py_buffer* b, Py_ssize_t n, const char* what) {
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (b->itemsize != sizeof(double) || strcmp(b->format, "d") != 0 ||
        (n >= 0 && b->len != n * (Py_ssize_t)sizeof(double))) {
        PyErr_Format(PyExc_ValueError, "%s: expected a contiguous float64 array", what);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject* Servo_state(Servo* s, PyObject* arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (b.itemsize != sizeof(double) || strcmp(b.format, "d") != 0 ||
        b.len != (Py_ssize_t)(2 * s->n + 6) * 8) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "state: expected a float64 array of 2n + 6");
        return NULL;
    }
    double* o = (double*)b.buf;
    int rc = fresh_state(s, o, o + s->n, o + 2 * s->n);
    PyBuffer_Release(&b);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* set_ft_frame(rot9, com3) */
static PyObject* Servo_set_ft_frame(Servo* s, PyObject* args) {
    PyObject *rot, *com;
    if (!PyArg_ParseTuple(args, "OO", &rot, &com)) return NULL;
    if (read_doubles(rot, s->ft_rot, 9, "rot") < 0 || read_doubles(com, s->ft_com, 3, "com") < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* set_sensor(bias, drift_sigma, std3, pq_step, vq_step, ft_bias, ft_std): the sensor model of a
 * draw. The drift keeps its value (an interval redraw does not re-home the encoders). */
static PyObject* Servo_set_sensor(Servo* s, PyObject* args) {
    PyObject *bias, *drift, *std3, *pq, *vq, *ftb, *fts;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &bias, &drift, &std3, &pq, &vq, &ftb, &fts))
        return NULL;
    const int n = s->n;
    if (read_doubles(bias, s->bias, n, "bias") < 0 ||
        read_doubles(drift, s->drift_sigma, n, "drift_sigma") < 0 ||
        read_doubles(std3, s->std3, 3 * n, "std3") < 0 ||
        read_doubles(pq, s->pq_step, n, "pq_step") < 0 ||
        read_doubles(vq, s->vq_step, n, "vq_step") < 0 ||
        read_doubles(ftb, s->ft_bias, 6, "ft_bias") < 0 ||
        read_doubles(fts, s->ft_std, 6, "ft_std") < 0)
        return NULL;
    s->noisy = s->drifting = s->pq_any = s->vq_any = s->ft_noise = 0;
    for (int i = 0; i < 3 * n; i++) s->noisy |= s->std3[i] > 0;
    for (int j = 0; j < n; j++) {
        s->drifting |= s->drift_sigma[j] > 0;
        s->pq_on[j] = s->pq_step[j] > 0;
        s->vq_on[j] = s->vq_step[j] > 0;
        s->pq_any |= s->pq_on[j];
        s->vq_any |= s->vq_on[j];
        s->pq_inv[j] = 1.0 / (s->pq_on[j] ? s->pq_step[j] : 1.0);
        s->vq_inv[j] = 1.0 / (s->vq_on[j] ? s->vq_step[j] : 1.0);
    }
    for (int c = 0; c < 6; c++) s->ft_noise |= s->ft_std[c] > 0;
    s->has_sensor = 1;
    Py_RETURN_NONE;
}

/* set_latency(delay, jitter, drop) of the observation link. */
static PyObject* Servo_set_latency(Servo* s, PyObject* args) {
    if (!PyArg_ParseTuple(args, "ddd", &s->obs_delay, &s->obs_jitter, &s->obs_drop)) return NULL;
    Py_RETURN_NONE;
}

/* reset_sense(): a new episode: zero drift, no stamp yet, no last observation. */
static PyObject* Servo_reset_sense(Servo* s, PyObject* noargs) {
    (void)noargs;
    for (int j = 0; j < s->n; j++) s->drift[j] = 0.0;
    s->has_drift_stamp = 0;
    s->drift_stamp = 0.0;
    s->last_stamp = 0.0;
    s->has_last_obs = 0;
    release_blocks(s);
    Py_RETURN_NONE;
}

/* set_normals(block) / set_uniforms(block): the next values of the two generator streams. */
static PyObject* Servo_set_normals(Servo* s, PyObject* arg) {
    if (s->has_n) PyBuffer_Release(&s->nbuf);
    s->has_n = 0;
    if (get_vec(arg, &s->nbuf, -1, "normals") < 0) return NULL;
    s->has_n = 1;
    s->nlen = s->nbuf.len / 8;
    s->nidx = 0;
    Py_RETURN_NONE;
}

static PyObject* Servo_set_uniforms(Servo* s, PyObject* arg) {
    if (s->has_u) PyBuffer_Release(&s->ubuf);
    s->has_u = 0;
    if (get_vec(arg, &s->ubuf, -1, "uniforms") < 0) return NULL;
    s->has_u = 1;
    s->ulen = s->ubuf.len / 8;
    s->uidx = 0;
    Py_RETURN_NONE;
}

/* sense(out, steps) -> 1 measured, 0 lost (drop; out untouched), -1 needs more random numbers
 * (nothing consumed). out = [t_stamp, q(n), qd(n), tau(n), wrench(6)]; the reference is
 * SimCore._observe_python. */
static PyObject* Servo_sense(Servo* s, PyObject* args) {
    PyObject* obj;
    long long steps;
    if (!PyArg_ParseTuple(args, "OL", &obj, &steps)) return NULL;
    const int n = s->n;
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (b.itemsize != sizeof(double) || strcmp(b.format, "d") != 0 ||
        b.len != (Py_ssize_t)(3 * n + 7) * 8) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "sense: expected a float64 array of 3n + 7");
        return NULL;
    }
    if (!s->has_sensor) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_RuntimeError, "set_sensor was not called");
        return NULL;
    }
    /* Enough random numbers for the worst case of this call, or ask for more. */
    Py_ssize_t need_n = 1 + n + 3 * n + 6, need_u = 1;
    if ((s->has_n ? s->nlen - s->nidx : 0) < need_n ||
        (s->has_u ? s->ulen - s->uidx : 0) < need_u) {
        PyBuffer_Release(&b);
        return PyLong_FromLong(-1);
    }
    const double* z = (const double*)s->nbuf.buf;
    const double* u = (const double*)s->ubuf.buf;
    const double now = (double)steps * s->dt;
    if (s->obs_drop > 0 && s->has_last_obs) {
        double r = u[s->uidx++];
        if (r < s->obs_drop) {
            PyBuffer_Release(&b);
            return PyLong_FromLong(0);
        }
    }
    double* o = (double*)b.buf;
    double* q = o + 1;
    double* qd = o + 1 + n;
    double* tau = o + 1 + 2 * n;
    double* w = o + 1 + 3 * n;
    double delay = s->obs_delay;
    if (s->obs_jitter > 0) delay += fabs(s->obs_jitter * z[s->nidx++]);
    double t_state;
    int fresh = 1;
    if (delay > 0) {
        double stamp = now - delay;
        if (stamp < s->last_stamp) stamp = s->last_stamp;
        if (stamp < 0.0) stamp = 0.0;
        if (stamp > now) stamp = now;
        long long k = (long long)floor(stamp / s->dt + 1e-9);
        if (k < steps && s->hist_len > 0) {
            long long lo = steps - s->hist_len + 1;
            if (k < lo) k = lo;
            if (k < 0) k = 0;
            long long i = k % s->hist_len;
            const double* hq = (const double*)s->hq.buf + i * n;
            const double* hqd = (const double*)s->hqd.buf + i * n;
            const double* ht = (const double*)s->htau.buf + i * n;
            for (int j = 0; j < n; j++) {
                q[j] = hq[j];
                qd[j] = hqd[j];
                tau[j] = ht[j];
            }
            if (s->has_ft)
                raw_to_wrench(s, (const double*)s->hft.buf + i * 6, w);
            else
                for (int c = 0; c < 6; c++) w[c] = 0.0;
            t_state = (double)k * s->dt;
            fresh = 0;
        }
    }
    if (fresh) {
        if (fresh_state(s, q, qd, w) < 0) {
            PyBuffer_Release(&b);
            return NULL;
        }
        for (int j = 0; j < n; j++) tau[j] = s->tau[j];
        t_state = now;
    }
    s->last_stamp = t_state;
    o[0] = t_state;
    /* encoders: drift random walk to the stamp, bias, noise, quantization */
    if (s->has_drift_stamp && s->drifting && t_state > s->drift_stamp) {
        double scale = sqrt(t_state - s->drift_stamp);
        for (int j = 0; j < n; j++)
            s->drift[j] = s->drift[j] + z[s->nidx + j] * (s->drift_sigma[j] * scale);
        s->nidx += n;
    }
    if (!s->has_drift_stamp || t_state > s->drift_stamp) {
        s->drift_stamp = t_state;
        s->has_drift_stamp = 1;
    }
    for (int j = 0; j < n; j++) q[j] = q[j] + (s->bias[j] + s->drift[j]);
    if (s->noisy) {
        const double* zz = z + s->nidx;
        for (int j = 0; j < n; j++) {
            q[j] = q[j] + zz[j] * s->std3[j];
            qd[j] = qd[j] + zz[n + j] * s->std3[n + j];
            tau[j] = tau[j] + zz[2 * n + j] * s->std3[2 * n + j];
        }
        s->nidx += 3 * n;
    }
    if (s->pq_any)
        for (int j = 0; j < n; j++)
            if (s->pq_on[j]) q[j] = rint(q[j] * s->pq_inv[j]) * s->pq_step[j];
    if (s->vq_any)
        for (int j = 0; j < n; j++)
            if (s->vq_on[j]) qd[j] = rint(qd[j] * s->vq_inv[j]) * s->vq_step[j];
    for (int c = 0; c < 6; c++) w[c] = w[c] + s->ft_bias[c];
    if (s->ft_noise) {
        for (int c = 0; c < 6; c++) w[c] = w[c] + z[s->nidx + c] * s->ft_std[c];
        s->nidx += 6;
    }
    s->has_last_obs = 1;
    PyBuffer_Release(&b);
    return PyLong_FromLong(1);
}


static PyObject* Servo_get_tau(Servo* s, void* closure) {
    (void)closure;
    return to_list(s->tau, s->n);
}

static PyObject* Servo_get_q_last(Servo* s, void* closure) {
    (void)closure;
    return to_list(s->q_last, s->n);
}

static PyMethodDef Servo_methods[] = {
    {"read", (PyCFunction)Servo_read, METH_NOARGS, "Read the joints through the C API."},
    {"rebind", (PyCFunction)Servo_rebind, METH_VARARGS, "rebind(body, read_idx, dof_idx, has_ft)"},
    {"set_limits", (PyCFunction)Servo_set_limits, METH_VARARGS,
     "set_limits(lim, alpha, vmax, lagged)"},
    {"set_command", (PyCFunction)Servo_set_command, METH_VARARGS, "set_command(mode, target)"},
    {"set_tau", (PyCFunction)Servo_set_tau, METH_O, "set_tau(values)"},
    {"set_history", (PyCFunction)Servo_set_history, METH_VARARGS,
     "set_history(q, qd, tau, ft) or set_history()"},
    {"advance", (PyCFunction)Servo_advance, METH_VARARGS, "advance(k, step0)"},
    {"set_gain_model", (PyCFunction)Servo_set_gain_model, METH_VARARGS,
     "set_gain_model(nominal_handle, nominal_body, dof_sel, kp_pi, kd_pi, damping, dt, every)"},
    {"update_gains", (PyCFunction)Servo_update_gains, METH_NOARGS, "Refresh the gains now."},
    {"gains", (PyCFunction)Servo_gains, METH_NOARGS, "(kp, kd, kp_eff, kd_eff, kpos, damp)"},
    {"set_q", (PyCFunction)Servo_set_q, METH_VARARGS, "set_q(q, qd): the last state read"},
    {"state", (PyCFunction)Servo_state, METH_O, "state(out[2n+6]): a fresh read"},
    {"set_ft_frame", (PyCFunction)Servo_set_ft_frame, METH_VARARGS, "set_ft_frame(rot9, com3)"},
    {"set_sensor", (PyCFunction)Servo_set_sensor, METH_VARARGS,
     "set_sensor(bias, drift_sigma, std3, pq_step, vq_step, ft_bias, ft_std)"},
    {"set_latency", (PyCFunction)Servo_set_latency, METH_VARARGS,
     "set_latency(delay, jitter, drop)"},
    {"reset_sense", (PyCFunction)Servo_reset_sense, METH_NOARGS, "A new episode for sensing."},
    {"set_normals", (PyCFunction)Servo_set_normals, METH_O, "The next standard normals."},
    {"set_uniforms", (PyCFunction)Servo_set_uniforms, METH_O, "The next uniforms in [0, 1)."},
    {"sense", (PyCFunction)Servo_sense, METH_VARARGS, "sense(out[3n+7], steps) -> 1, 0 or -1"},
    {NULL, NULL, 0, NULL},
};

static PyObject* Servo_get_normals_left(Servo* s, void* closure) {
    (void)closure;
    return PyLong_FromSsize_t(s->has_n ? s->nlen - s->nidx : 0);
}

static PyObject* Servo_get_uniforms_left(Servo* s, void* closure) {
    (void)closure;
    return PyLong_FromSsize_t(s->has_u ? s->ulen - s->uidx : 0);
}

static PyObject* Servo_get_drift(Servo* s, void* closure) {
    (void)closure;
    return to_list(s->drift, s->n);
}

static PyGetSetDef Servo_getset[] = {
    {"normals_left", (getter)Servo_get_normals_left, NULL, "Unused normals.", NULL},
    {"uniforms_left", (getter)Servo_get_uniforms_left, NULL, "Unused uniforms.", NULL},
    {"drift", (getter)Servo_get_drift, NULL, "Encoder drift, rad.", NULL},
    {"tau", (getter)Servo_get_tau, NULL, "Motor torque of the last step.", NULL},
    {"q_last", (getter)Servo_get_q_last, NULL, "Joint positions of the last read.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ServoType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sim2real_ros.sim._servo.Servo",
    .tp_basicsize = sizeof(Servo),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The plant's servo and physics-step loop on PyBullet's C API.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Servo_init,
    .tp_dealloc = (destructor)Servo_dealloc,
    .tp_methods = Servo_methods,
    .tp_getset = Servo_getset,
};

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_O, "bind(path of the loaded pybullet module): look up the C API."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_servo", "The plant's physics-step loop in C.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__servo(void) {
    if (PyType_Ready(&ServoType) < 0) return NULL;
    PyObject* m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ServoType);
    if (PyModule_AddObject(m, "Servo", (PyObject*)&ServoType) < 0) {
        Py_DECREF(&ServoType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "MAXJ", MAXJ);
    return m;
}
