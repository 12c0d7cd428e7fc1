-- Run once by the postgres image of docker-compose.yml, at its first start:
-- the tests' database (OUTFLOW_TEST_DATABASE_URL's default) beside outflow,
-- which POSTGRES_DB creates.
CREATE DATABASE outflow_test;
