-- Run once on the database server as its superuser:  psql -f create-database.sql
-- Choose your own password; the hosts read it from a 0600 file (cluster.password_file).
CREATE ROLE dispatch LOGIN PASSWORD 'change-me';
CREATE DATABASE dispatch OWNER dispatch;
-- dispatch creates and upgrades its own tables (dispatch_schema records the version) the first
-- time a command or a serve connects. The hosts need network access to the server: add a line
-- like this one to pg_hba.conf (the addresses of your worker hosts), then reload the server:
--   host  dispatch  dispatch  10.0.0.0/24  scram-sha-256
