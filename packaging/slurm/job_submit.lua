--[[
slurm-recovery: submit the jobs of chosen partitions with --requeue=expedite, so that on
Slurm 25.11 and later (SlurmctldParameters=enable_expedited_requeue) Slurm requeues them at once
after a node failure or a failed Epilog (docs/install.md, "Slurm 25.11 and later").

Installed by the slurm-recovery-controller RPM as /usr/share/slurm-recovery/job_submit.lua.
Use it as it is (copy it next to slurm.conf, JobSubmitPlugins=lua), or copy the function
srecovery_expedite into your own job_submit.lua and call it from slurm_job_submit.

It never overrides the user: a job submitted --no-requeue stays so, and one already marked is
left as it is. Before 25.11 (no slurm.EXPEDITED_REQUEUE) it does nothing. Written for Lua 5.1
(Debian's Slurm links it), so no bitwise operators.
]]

-- The partitions whose jobs are marked; the key "" stands for a job submitted without -p.
-- nil: every partition.
SRECOVERY_EXPEDITE_PARTITIONS = nil
-- Only jobs asking for at least this many nodes (1: every job).
SRECOVERY_EXPEDITE_MIN_NODES = 2
-- Whether slurmctld runs with SlurmctldParameters=enable_expedited_requeue. Without it Slurm
-- refuses an expedite job ("Requested operation not supported on this system"), so a job is
-- marked only when it is on. nil: read from the slurm.conf next to this script (where
-- slurmctld looks for it), again at most once a minute; anything unreadable means off.
SRECOVERY_EXPEDITE_ENABLED = nil

local NO_VAL = 4294967294
local enabled_cache, enabled_read_at = false, nil

local function read_enabled()
   local source = debug.getinfo(1, "S").source
   local dir = string.match(source, "^@(.*)/[^/]*$")
   if dir == nil then
      return false
   end
   local conf = io.open(dir .. "/slurm.conf", "r")
   if conf == nil then
      return false
   end
   local found = false
   for line in conf:lines() do
      local value = string.match(string.lower(line), "^%s*slurmctldparameters%s*=%s*(%S+)")
      if value ~= nil and string.find("," .. value .. ",", ",enable_expedited_requeue,", 1, true) then
         found = true
      end
   end
   conf:close()
   return found
end

local function expedite_enabled()
   if SRECOVERY_EXPEDITE_ENABLED ~= nil then
      return SRECOVERY_EXPEDITE_ENABLED
   end
   local now = os.time()
   if enabled_read_at == nil or now - enabled_read_at >= 60 then
      enabled_cache, enabled_read_at = read_enabled(), now
   end
   return enabled_cache
end

local function has_flag(flags, flag)
   return math.floor(flags / flag) % 2 == 1
end

local function chosen_partition(partition)
   if SRECOVERY_EXPEDITE_PARTITIONS == nil then
      return true
   end
   if partition == nil or partition == "" then
      return SRECOVERY_EXPEDITE_PARTITIONS[""] == true
   end
   for name in string.gmatch(partition, "[^,]+") do
      if SRECOVERY_EXPEDITE_PARTITIONS[name] then
         return true
      end
   end
   return false
end

function srecovery_expedite(job_desc)
   local flag = slurm.EXPEDITED_REQUEUE
   if flag == nil then
      return "not marked: this Slurm has no expedited requeue (25.11+)"
   end
   if not expedite_enabled() then
      return "not marked: SlurmctldParameters has no enable_expedited_requeue"
   end
   if job_desc.requeue == 0 then
      return "not marked: submitted --no-requeue"
   end
   if not chosen_partition(job_desc.partition) then
      return "not marked: partition not chosen"
   end
   local nodes = job_desc.min_nodes
   if nodes == nil or nodes == NO_VAL then
      nodes = 1
   end
   if nodes < SRECOVERY_EXPEDITE_MIN_NODES then
      return "not marked: fewer nodes than SRECOVERY_EXPEDITE_MIN_NODES"
   end
   local flags = job_desc.bitflags or 0
   if not has_flag(flags, flag) then
      job_desc.bitflags = flags + flag
   end
   job_desc.requeue = 1
   return "marked --requeue=expedite"
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local said = srecovery_expedite(job_desc)
   slurm.log_debug("slurm-recovery job_submit: %s", said)
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end

return slurm.SUCCESS
